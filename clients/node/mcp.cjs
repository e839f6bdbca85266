'use strict';
// `idemgate/mcp` for CommonJS: the gate built with the CommonJS zod (see mcp-gate.cjs).
const { makeGate, KEY_META, CALL_ID_META, CONVERSATION_META } = require('./mcp-gate.cjs');

module.exports = { gateTools: makeGate(require('zod').z), KEY_META, CALL_ID_META, CONVERSATION_META };

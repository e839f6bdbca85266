'use strict';
// `idemgate/langchain` for CommonJS (see langchain-tool.cjs).
const { makeLangChain } = require('./langchain-tool.cjs');

module.exports = { idempotentLangChainTool: makeLangChain(require('zod').z, require('@langchain/core/tools').tool) };

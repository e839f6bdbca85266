'use strict';
// `idemgate/langchain` for CommonJS (see langchain-tool.cjs).
const { makeLangChain } = require('./langchain-tool.cjs');

module.exports = {
  idempotentLangChainTool: makeLangChain(
    { z3: require('zod/v3').z, z4: require('zod/v4').z },
    require('@langchain/core/tools').tool,
    require('@langchain/core/messages').ToolMessage,
  ),
};

// `idemgate/langchain` for ESM (see langchain-tool.cjs).
import { z as z3 } from 'zod/v3';
import { z as z4 } from 'zod/v4';
import { tool } from '@langchain/core/tools';
import { ToolMessage } from '@langchain/core/messages';
import lc from './langchain-tool.cjs';

export const idempotentLangChainTool = lc.makeLangChain({ z3, z4 }, tool, ToolMessage);

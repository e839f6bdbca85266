// `idemgate/langchain` for ESM (see langchain-tool.cjs).
import { z } from 'zod';
import { tool } from '@langchain/core/tools';
import lc from './langchain-tool.cjs';

export const idempotentLangChainTool = lc.makeLangChain(z, tool);

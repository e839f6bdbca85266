// `idemgate/mcp` for ESM: the gate built with the ESM zod (see mcp-gate.cjs).
import { z } from 'zod';
import gate from './mcp-gate.cjs';

export const gateTools = gate.makeGate(z);
export const { KEY_META, CALL_ID_META, CONVERSATION_META } = gate;

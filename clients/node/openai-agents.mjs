import agents from './openai-agents.cjs';

export const { idempotentFunctionTool } = agents;
export default agents;

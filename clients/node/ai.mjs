import ai from './ai.cjs';

export const { idempotentTool, withKeyArgument } = ai;
export default ai;

// Checked by `tsc -p test/types` (scripts/test-node): the README's example and the error classes
// type-check against index.d.ts as a TypeScript agent writes them.
import { Engine, idempotent, OutcomeUnknown, OutcomeExpired, Failed, type Result } from 'idemgate';
import { idempotentTool } from 'idemgate/ai';
import { gateTools } from 'idemgate/mcp';
import { idempotentFunctionTool } from 'idemgate/openai-agents';
import { tool as agentTool } from '@openai/agents-core';
import { idempotentLangChainTool } from 'idemgate/langchain';
import { tool as lcTool } from '@langchain/core/tools';
import { tool } from 'ai';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';

async function main(): Promise<void> {
  const engine = await Engine.open('memory:', { tenant: 'types' });
  const charge = idempotent(
    engine,
    'charge',
    async (order: { id: string; amount: number }) => ({ chargeId: `ch-${order.id}`, amount: order.amount }),
    { key: (order) => order.id, ttl: 3600, tombstone: 30 * 86400 },
  );
  const receipt: { chargeId: string; amount: number } = await charge({ id: 'o-1', amount: 5 });
  const result: Result<{ chargeId: string; amount: number }> = await charge.result({ id: 'o-1', amount: 5 });
  const replayed: boolean = result.replayed;
  for (const r of await engine.records({ state: 'unknown', tool: 'charge' })) {
    const after = await engine.resolve(r.key.tool, r.key.key, r.fence, 'completed', {
      result: { chargeId: 'ch-o-2' },
      reason: 'the provider shows the charge',
    });
    if (after !== null) console.log(after.state, after.outcome?.body);
  }
  const was: 'completed' | 'expired' | 'unknown' = await engine.reopen('charge', 'o-1', result.replayed ? 1 : 2, {
    reason: 'refunded',
  });
  console.log(was);
  try {
    await charge({ id: 'o-2', amount: 1 });
  } catch (e) {
    if (e instanceof OutcomeUnknown) console.log(e.fence, e.since);
    if (e instanceof Failed) console.log(e.result, e.replayed);
    if (e instanceof OutcomeExpired) {
      const at: string | null = e.executedAt;
      const fence: number | null = e.fence;
      console.log(at, e.expiredAt, e.retainUntil, e.key, e.rule, e.forModel);
      if (fence !== null) await engine.reopen('charge', 'o-2', fence, { reason: 'charge again' });
    }
  }
  console.log(receipt, replayed);
  const mail = idempotentTool(engine, 'send_email', tool({
    inputSchema: z.object({ to: z.string() }),
    execute: async ({ to }) => `sent to ${to}`,
  }), { scope: 'conversation-1', window: 30 });
  const server: McpServer = gateTools(engine, new McpServer({ name: 'm', version: '1' }), { tools: { inbox: { kind: 'read' } } });
  const agentMail = idempotentFunctionTool(engine, agentTool({
    name: 'send_email',
    description: 'Send an email',
    parameters: z.object({ to: z.string() }),
    execute: async ({ to }) => `sent to ${to}`,
  }), { scope: 'conversation-1', errorFunction: (_runContext, error) => `idemgate: ${error.forModel}` });
  const lcMail = idempotentLangChainTool(engine, lcTool(async ({ to }: { to: string }) => `sent to ${to}`, {
    name: 'send_email',
    schema: z.object({ to: z.string() }),
  }));
  console.log(mail.description, server.isConnected(), agentMail.name, lcMail.name);
  engine.close();
}
void main();

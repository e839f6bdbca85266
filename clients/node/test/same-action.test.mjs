// The "same action" table (same-action.mjs) stamped for every Node door, each driven through its
// real framework and the framework's own fake model, with the adapter's default options.
import assert from 'node:assert/strict';
import { generateText, isStepCount, tool as aiTool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { Agent, Runner, tool as agentTool, Usage, setTracingDisabled } from '@openai/agents-core';
import { tool as lcTool } from '@langchain/core/tools';
import { FakeStreamingChatModel } from '@langchain/core/utils/testing';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import { z } from 'zod';
import { Engine } from '../index.mjs';
import { idempotentTool } from '../ai.mjs';
import { idempotentFunctionTool } from '../openai-agents.mjs';
import { idempotentLangChainTool } from '../langchain.mjs';
import { gateTools, CALL_ID_META, CONVERSATION_META } from '../mcp.mjs';
import { DOORS, stamp } from './same-action.mjs';
import { unique, within } from './helpers.mjs';

setTracingDisabled(true);

// `body`: what a re-plan rewords (the `replanned` case); absent elsewhere.
const schema = z.object({ to: z.string(), subject: z.string(), body: z.string().nullish() });
const asText = (v) => (typeof v === 'string' ? v : JSON.stringify(v));
/** The call a turn's entry names, given the texts the model read so far. */
const next = (entry, texts) => (typeof entry === 'function' ? entry(texts) : entry);

/** The text of a tool's output in a language model prompt (an AI SDK `ToolResultOutput`): what
 * the model reads, an error's text included. */
const outputText = (o) => (o.type === 'text' || o.type === 'error-text' ? o.value : JSON.stringify(o.value));
/** The texts of the tool results in a language model prompt, oldest first. */
const toolResults = (prompt) =>
  prompt.filter((m) => m.role === 'tool').flatMap((m) => m.content.filter((p) => p.type === 'tool-result').map((p) => outputText(p.output)));

/** The engine of one case and the mails its tool sends. */
async function mailer() {
  const engine = await Engine.open('memory:', { tenant: unique('t') });
  const sent = [];
  const send = async ({ to, subject }) => {
    sent.push({ to, subject });
    return `sent m-${sent.length} to ${to}`;
  };
  return { engine, sent, send };
}

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};

stamp({
  ...DOORS.ai,
  async open(options = {}) {
    const { engine, sent, send } = await mailer();
    const wrapped = idempotentTool(engine, 'send_email', aiTool({ inputSchema: schema, execute: send }), options);
    return {
      sent: () => sent.length,
      conversation() {
        const messages = []; // the program's history, passed on every turn
        return {
          async turn(calls) {
            // What the model reads: the tool results (or errors) the SDK puts in its prompt
            // after those of earlier turns.
            let texts = [];
            let earlier = null;
            let i = 0;
            const model = new MockLanguageModelV4({
              doGenerate: async ({ prompt }) => {
                const read = toolResults(prompt);
                earlier ??= read.length;
                texts = read.slice(earlier);
                if (i === calls.length) return { content: [{ type: 'text', text: 'done' }], finishReason: { unified: 'stop', raw: undefined }, usage, warnings: [] };
                const c = next(calls[i++], texts);
                return {
                  content: [{ type: 'tool-call', toolCallId: c.id, toolName: 'send_email', input: JSON.stringify(c.args) }],
                  finishReason: { unified: 'tool-calls', raw: undefined }, usage, warnings: [],
                };
              },
            });
            messages.push({ role: 'user', content: 'mail Ann the invoice' });
            const r = await generateText({ model, tools: { send_email: wrapped }, messages, stopWhen: isStepCount(calls.length + 1) });
            messages.push(...r.response.messages);
            assert.equal(texts.length, calls.length);
            return texts;
          },
        };
      },
    };
  },
});

/** The OpenAI Agents JS door; `named`: each conversation's runs carry its `conversationId` in
 * their context (else a conversation is its one run). */
const agentsDoor = (description, named) => ({
  ...description,
  async open(options = {}) {
    const { engine, sent, send } = await mailer();
    const wrapped = idempotentFunctionTool(engine, agentTool({ name: 'send_email', description: 'Send an email', parameters: schema, execute: send }), options);
    return {
      sent: () => sent.length,
      conversation() {
        const runOptions = named ? { context: { conversationId: unique('conversation') } } : undefined;
        return {
          async turn(calls) {
            const texts = [];
            const tracked = { ...wrapped, invoke: async (...a) => { const v = await wrapped.invoke(...a); texts.push(asText(v)); return v; } };
            let i = 0;
            const model = {
              async getResponse() {
                if (i === calls.length) {
                  return { usage: new Usage(), output: [{ type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'done' }] }] };
                }
                const c = next(calls[i++], texts);
                return { usage: new Usage(), output: [{ type: 'function_call', callId: c.id, name: 'send_email', arguments: JSON.stringify(c.args), status: 'completed' }] };
              },
              async *getStreamedResponse() {
                throw new Error('not streamed');
              },
            };
            const agent = new Agent({ name: 'mailer', instructions: 'mail', tools: [tracked], model });
            await within(new Runner().run(agent, 'mail Ann the invoice', runOptions), 'the run');
            // A call id the run has an output for already is not invoked again by the SDK itself.
            return texts;
          },
        };
      },
    };
  },
});

stamp(agentsDoor(DOORS.agents, false));
stamp(agentsDoor(DOORS.agentsNamed, true));

/** The LangChain.js door; `config()` is what a conversation's calls are invoked with. */
function langchainDoor(description, config) {
  return {
    ...description,
    async open(options = {}) {
      const { engine, sent, send } = await mailer();
      const wrapped = idempotentLangChainTool(engine, lcTool(send, { name: 'send_email', description: 'Send an email', schema }), options);
      return {
        sent: () => sent.length,
        conversation() {
          const conversation = config();
          return {
            async turn(calls) {
              const texts = [];
              for (const entry of calls) {
                const c = next(entry, texts);
                const model = new FakeStreamingChatModel({
                  chunks: [{ content: '', tool_calls: [{ name: 'send_email', args: c.args, id: c.id, type: 'tool_call' }] }],
                }).bindTools([wrapped]);
                const ai = await model.invoke([['human', 'mail Ann the invoice']]);
                const message = await wrapped.invoke(ai.tool_calls[0], conversation);
                texts.push(asText(message.content));
              }
              return texts;
            },
          };
        },
      };
    },
  };
}

stamp(langchainDoor(DOORS.langchain, () => ({ configurable: { thread_id: unique('thread') } })));
stamp(langchainDoor(DOORS.langchainBare, () => ({})));

stamp({
  ...DOORS.mcpCallIds,
  async open({ key, ...policy } = {}) {
    const { engine, sent, send } = await mailer();
    // One session for every conversation (a desktop agent's one connection): what keeps two
    // conversations apart is the conversation the client names beside each call id.
    const server = gateTools(engine, new McpServer({ name: 'mail', version: '1.0.0' }), { key, tools: { send_email: policy } });
    server.registerTool('send_email', { inputSchema: schema.shape }, async (args) => ({
      content: [{ type: 'text', text: await send(args) }],
    }));
    const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
    const client = new Client({ name: 'agent', version: '1.0.0' });
    await Promise.all([server.connect(serverSide), client.connect(clientSide)]);
    let conversations = 0;
    return {
      sent: () => sent.length,
      conversation() {
        const conversation = `conv-${++conversations}`;
        return {
          async turn(calls) {
            const texts = [];
            for (const entry of calls) {
              const { id, args } = next(entry, texts);
              const r = await client.callTool({
                name: 'send_email',
                arguments: args,
                _meta: { [CALL_ID_META]: id, [CONVERSATION_META]: conversation },
              });
              texts.push(r.content.map((b) => b.text).join('\n'));
            }
            return texts;
          },
        };
      },
    };
  },
});

stamp({
  ...DOORS.mcp,
  async open({ key, ...policy } = {}) {
    const { engine, sent, send } = await mailer();
    return {
      sent: () => sent.length,
      conversation() {
        let client = null; // one session per conversation, opened on its first turn
        const connect = async () => {
          const server = gateTools(engine, new McpServer({ name: 'mail', version: '1.0.0' }), {
            tools: { send_email: { ...policy, window: 60 } },
            key,
          });
          server.registerTool('send_email', { inputSchema: schema.shape }, async (args) => ({
            content: [{ type: 'text', text: await send(args) }],
          }));
          const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
          const c = new Client({ name: 'agent', version: '1.0.0' });
          await Promise.all([server.connect(serverSide), c.connect(clientSide)]);
          return c;
        };
        return {
          async turn(calls) {
            client ??= await connect();
            const texts = [];
            for (const entry of calls) {
              // The model's call id is the MCP client's business: its request never carries it.
              const { args } = next(entry, texts);
              const r = await client.callTool({ name: 'send_email', arguments: args });
              texts.push(r.content.map((b) => b.text).join('\n'));
            }
            return texts;
          },
        };
      },
    };
  },
});

// The fixture MCP server for scripts/mcp-conformance: the tools, resources and prompts the server
// scenarios of @modelcontextprotocol/conformance call, written against the official TypeScript
// SDK (low-level Server API, so every schema goes out exactly as written here).
//
//   node mcp-conformance-server.mjs --stdio        one session on stdin/stdout (behind idemgate mcp)
//   node mcp-conformance-server.mjs --http PORT    Streamable HTTP at http://127.0.0.1:PORT/mcp, a
//                                                  Server per session (the direct baseline)
//
// scripts/mcp-conformance copies this file next to the pinned SDK (target/mcp-deps/conformance)
// so that its imports resolve; it is not meant to run from scripts/.
import { randomUUID } from 'node:crypto';
import http from 'node:http';

import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { InMemoryEventStore } from '@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js';
import {
  CallToolRequestSchema,
  CompleteRequestSchema,
  CreateMessageResultSchema,
  ElicitResultSchema,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  ReadResourceRequestSchema,
  SetLevelRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
  McpError,
  ErrorCode,
} from '@modelcontextprotocol/sdk/types.js';

// A 1x1 PNG and a tiny WAV (44-byte header, 2 samples of silence).
const PNG =
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';
const WAV = Buffer.concat([
  Buffer.from('RIFF'), u32(40), Buffer.from('WAVEfmt '), u32(16), u16(1), u16(1), u32(8000),
  u32(16000), u16(2), u16(16), Buffer.from('data'), u32(4), Buffer.alloc(4),
]).toString('base64');
function u32(n) { const b = Buffer.alloc(4); b.writeUInt32LE(n); return b; }
function u16(n) { const b = Buffer.alloc(2); b.writeUInt16LE(n); return b; }

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const noArgs = { type: 'object', properties: {} };
const text = (t) => ({ type: 'text', text: t });

const TOOLS = [
  { name: 'test_simple_text', description: 'Returns one text block', inputSchema: noArgs },
  { name: 'test_image_content', description: 'Returns a PNG image', inputSchema: noArgs },
  { name: 'test_audio_content', description: 'Returns a WAV clip', inputSchema: noArgs },
  { name: 'test_embedded_resource', description: 'Returns an embedded resource', inputSchema: noArgs },
  { name: 'test_multiple_content_types', description: 'Returns text, image and resource', inputSchema: noArgs },
  { name: 'test_tool_with_logging', description: 'Logs three messages while it runs', inputSchema: noArgs },
  { name: 'test_tool_with_progress', description: 'Reports progress 0, 50, 100 of 100', inputSchema: noArgs },
  { name: 'test_error_handling', description: 'Always answers isError', inputSchema: noArgs },
  {
    name: 'test_sampling',
    description: 'Asks the client for a completion',
    inputSchema: { type: 'object', properties: { prompt: { type: 'string' } }, required: ['prompt'] },
  },
  {
    name: 'test_elicitation',
    description: 'Asks the user for a username and an email',
    inputSchema: { type: 'object', properties: { message: { type: 'string' } }, required: ['message'] },
  },
  { name: 'test_elicitation_sep1034_defaults', description: 'Elicitation with defaults', inputSchema: noArgs },
  { name: 'test_elicitation_sep1330_enums', description: 'Elicitation with every enum form', inputSchema: noArgs },
  {
    name: 'json_schema_2020_12_tool',
    description: 'Tool with JSON Schema 2020-12 features',
    inputSchema: {
      $schema: 'https://json-schema.org/draft/2020-12/schema',
      type: 'object',
      $defs: {
        address: { type: 'object', properties: { street: { type: 'string' }, city: { type: 'string' } } },
      },
      properties: { name: { type: 'string' }, address: { $ref: '#/$defs/address' } },
      additionalProperties: false,
    },
  },
  { name: 'test_reconnection', description: 'Closes its SSE stream mid-call (HTTP only), then answers', inputSchema: noArgs },
];

const RESOURCES = [
  { uri: 'test://static-text', name: 'static-text', description: 'Static text', mimeType: 'text/plain' },
  { uri: 'test://static-binary', name: 'static-binary', description: 'Static PNG', mimeType: 'image/png' },
  { uri: 'test://watched-resource', name: 'watched-resource', description: 'Subscribable', mimeType: 'text/plain' },
];

const PROMPTS = [
  { name: 'test_simple_prompt', description: 'A prompt without arguments' },
  {
    name: 'test_prompt_with_arguments',
    description: 'A prompt with two arguments',
    arguments: [
      { name: 'arg1', description: 'First test argument', required: true },
      { name: 'arg2', description: 'Second test argument', required: true },
    ],
  },
  {
    name: 'test_prompt_with_embedded_resource',
    description: 'A prompt embedding a resource',
    arguments: [{ name: 'resourceUri', description: 'URI of the resource to embed', required: true }],
  },
  { name: 'test_prompt_with_image', description: 'A prompt with an image' },
];

async function callTool(name, args, extra) {
  switch (name) {
    case 'test_simple_text':
      return { content: [text('This is a simple text response for testing.')] };
    case 'test_image_content':
      return { content: [{ type: 'image', data: PNG, mimeType: 'image/png' }] };
    case 'test_audio_content':
      return { content: [{ type: 'audio', data: WAV, mimeType: 'audio/wav' }] };
    case 'test_embedded_resource':
      return {
        content: [{
          type: 'resource',
          resource: { uri: 'test://embedded-resource', mimeType: 'text/plain', text: 'This is an embedded resource content.' },
        }],
      };
    case 'test_multiple_content_types':
      return {
        content: [
          text('Multiple content types test:'),
          { type: 'image', data: PNG, mimeType: 'image/png' },
          {
            type: 'resource',
            resource: { uri: 'test://mixed-content-resource', mimeType: 'application/json', text: '{"test":"data","value":123}' },
          },
        ],
      };
    case 'test_tool_with_logging':
      for (const [i, data] of ['Tool execution started', 'Tool processing data', 'Tool execution completed'].entries()) {
        if (i > 0) await sleep(50);
        await extra.sendNotification({ method: 'notifications/message', params: { level: 'info', data } });
      }
      return { content: [text('Logging tool finished')] };
    case 'test_tool_with_progress': {
      const token = extra._meta?.progressToken;
      for (const [i, progress] of [0, 50, 100].entries()) {
        if (i > 0) await sleep(50);
        if (token !== undefined) {
          await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress, total: 100 } });
        }
      }
      return { content: [text('Progress tool finished')] };
    }
    case 'test_error_handling':
      return { isError: true, content: [text('This tool intentionally returns an error for testing')] };
    case 'test_sampling': {
      const res = await extra.sendRequest(
        {
          method: 'sampling/createMessage',
          params: { messages: [{ role: 'user', content: text(String(args.prompt ?? '')) }], maxTokens: 100 },
        },
        CreateMessageResultSchema,
      );
      const reply = res.content?.type === 'text' ? res.content.text : JSON.stringify(res.content);
      return { content: [text(`LLM response: ${reply}`)] };
    }
    case 'test_elicitation': {
      const res = await elicit(extra, String(args.message ?? ''), {
        type: 'object',
        properties: {
          username: { type: 'string', description: "User's response" },
          email: { type: 'string', description: "User's email address" },
        },
        required: ['username', 'email'],
      });
      return { content: [text(`User response: action=${res.action}, content=${JSON.stringify(res.content ?? {})}`)] };
    }
    case 'test_elicitation_sep1034_defaults': {
      const res = await elicit(extra, 'Please review the defaults', {
        type: 'object',
        properties: {
          name: { type: 'string', default: 'John Doe' },
          age: { type: 'integer', default: 30 },
          score: { type: 'number', default: 95.5 },
          status: { type: 'string', enum: ['active', 'inactive', 'pending'], default: 'active' },
          verified: { type: 'boolean', default: true },
        },
      });
      return { content: [text(`Elicitation completed: action=${res.action}, content=${JSON.stringify(res.content ?? {})}`)] };
    }
    case 'test_elicitation_sep1330_enums': {
      const res = await elicit(extra, 'Please choose', {
        type: 'object',
        properties: {
          untitledSingle: { type: 'string', enum: ['option1', 'option2', 'option3'] },
          titledSingle: {
            type: 'string',
            oneOf: [
              { const: 'value1', title: 'First Option' },
              { const: 'value2', title: 'Second Option' },
              { const: 'value3', title: 'Third Option' },
            ],
          },
          legacyEnum: {
            type: 'string',
            enum: ['opt1', 'opt2', 'opt3'],
            enumNames: ['Option One', 'Option Two', 'Option Three'],
          },
          untitledMulti: { type: 'array', items: { type: 'string', enum: ['option1', 'option2', 'option3'] } },
          titledMulti: {
            type: 'array',
            items: {
              anyOf: [
                { const: 'value1', title: 'First Choice' },
                { const: 'value2', title: 'Second Choice' },
                { const: 'value3', title: 'Third Choice' },
              ],
            },
          },
        },
      });
      return { content: [text(`Elicitation completed: action=${res.action}, content=${JSON.stringify(res.content ?? {})}`)] };
    }
    case 'json_schema_2020_12_tool':
      return { content: [text(`Received: ${JSON.stringify(args)}`)] };
    case 'test_reconnection':
      // Over HTTP the SDK can end this request's SSE stream; the client reconnects with
      // Last-Event-ID and gets the answer from the event store. Over stdio there is no stream.
      await sleep(100);
      extra.closeSSEStream?.();
      await sleep(200);
      return { content: [text('Reconnection test completed')] };
    default:
      throw new McpError(ErrorCode.InvalidParams, `unknown tool ${name}`);
  }
}

function elicit(extra, message, requestedSchema) {
  return extra.sendRequest({ method: 'elicitation/create', params: { message, requestedSchema } }, ElicitResultSchema);
}

function readResource(uri) {
  if (uri === 'test://static-text') {
    return { contents: [{ uri, mimeType: 'text/plain', text: 'This is the content of the static text resource.' }] };
  }
  if (uri === 'test://static-binary') return { contents: [{ uri, mimeType: 'image/png', blob: PNG }] };
  if (uri === 'test://watched-resource') return { contents: [{ uri, mimeType: 'text/plain', text: 'Watched resource content' }] };
  const m = /^test:\/\/template\/([^/]+)\/data$/.exec(uri);
  if (m) {
    const id = m[1];
    return {
      contents: [{ uri, mimeType: 'application/json', text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) }],
    };
  }
  throw new McpError(ErrorCode.InvalidParams, `unknown resource ${uri}`);
}

function getPrompt(name, args) {
  switch (name) {
    case 'test_simple_prompt':
      return { messages: [{ role: 'user', content: text('This is a simple prompt for testing.') }] };
    case 'test_prompt_with_arguments':
      return { messages: [{ role: 'user', content: text(`Prompt with arguments: arg1='${args.arg1}', arg2='${args.arg2}'`) }] };
    case 'test_prompt_with_embedded_resource':
      return {
        messages: [
          {
            role: 'user',
            content: {
              type: 'resource',
              resource: { uri: args.resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' },
            },
          },
          { role: 'user', content: text('Please process the embedded resource above.') },
        ],
      };
    case 'test_prompt_with_image':
      return {
        messages: [
          { role: 'user', content: { type: 'image', data: PNG, mimeType: 'image/png' } },
          { role: 'user', content: text('Please analyze the image above.') },
        ],
      };
    default:
      throw new McpError(ErrorCode.InvalidParams, `unknown prompt ${name}`);
  }
}

function newServer() {
  const server = new Server(
    { name: 'idemgate-conformance-fixture', version: '1.0.0' },
    {
      capabilities: {
        tools: { listChanged: true },
        resources: { subscribe: true, listChanged: true },
        prompts: { listChanged: true },
        logging: {},
        completions: {},
      },
    },
  );
  const subscriptions = new Set();
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));
  server.setRequestHandler(CallToolRequestSchema, async (req, extra) =>
    callTool(req.params.name, req.params.arguments ?? {}, { ...extra, _meta: req.params._meta }));
  server.setRequestHandler(ListResourcesRequestSchema, async () => ({ resources: RESOURCES }));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({
    resourceTemplates: [{
      uriTemplate: 'test://template/{id}/data', name: 'template', description: 'Data by id', mimeType: 'application/json',
    }],
  }));
  server.setRequestHandler(ReadResourceRequestSchema, async (req) => readResource(req.params.uri));
  server.setRequestHandler(SubscribeRequestSchema, async (req) => { subscriptions.add(req.params.uri); return {}; });
  server.setRequestHandler(UnsubscribeRequestSchema, async (req) => { subscriptions.delete(req.params.uri); return {}; });
  server.setRequestHandler(ListPromptsRequestSchema, async () => ({ prompts: PROMPTS }));
  server.setRequestHandler(GetPromptRequestSchema, async (req) => getPrompt(req.params.name, req.params.arguments ?? {}));
  server.setRequestHandler(CompleteRequestSchema, async (req) => {
    const words = ['paris', 'park', 'party', 'test', 'testing'];
    const values = words.filter((w) => w.startsWith(req.params.argument.value));
    return { completion: { values, total: values.length, hasMore: false } };
  });
  server.setRequestHandler(SetLevelRequestSchema, async () => ({}));
  return server;
}

async function serveHttp(port) {
  const sessions = new Map();
  let hosts = []; // set once listening: port 0 picks a free port
  const httpServer = http.createServer(async (req, res) => {
    try {
      if (new URL(req.url, 'http://x').pathname !== '/mcp') {
        res.writeHead(404).end();
        return;
      }
      let body;
      if (req.method === 'POST') {
        const chunks = [];
        for await (const c of req) chunks.push(c);
        try { body = JSON.parse(Buffer.concat(chunks).toString('utf8')); } catch { body = undefined; }
      }
      const sid = req.headers['mcp-session-id'];
      let transport = sid ? sessions.get(sid) : undefined;
      if (!transport) {
        if (sid || req.method !== 'POST' || body?.method !== 'initialize') {
          res.writeHead(sid ? 404 : 400, { 'content-type': 'application/json' }).end(JSON.stringify({
            jsonrpc: '2.0', id: null, error: { code: -32000, message: sid ? 'no such session' : 'initialize first' },
          }));
          return;
        }
        transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          eventStore: new InMemoryEventStore(),
          retryInterval: 500,
          enableDnsRebindingProtection: true,
          allowedHosts: hosts,
          allowedOrigins: hosts.map((h) => `http://${h}`),
          onsessioninitialized: (id) => sessions.set(id, transport),
        });
        const t = transport;
        t.onclose = () => { if (t.sessionId) sessions.delete(t.sessionId); };
        await newServer().connect(t);
      }
      await transport.handleRequest(req, res, body);
    } catch (e) {
      if (!res.headersSent) res.writeHead(500).end(String(e));
    }
  });
  httpServer.listen(port, '127.0.0.1', () => {
    const bound = httpServer.address().port;
    hosts = [`127.0.0.1:${bound}`, `localhost:${bound}`];
    process.stderr.write(`fixture: Streamable HTTP at http://127.0.0.1:${bound}/mcp\n`);
  });
}

const [mode, arg] = process.argv.slice(2);
if (mode === '--stdio') {
  await newServer().connect(new StdioServerTransport());
} else if (mode === '--http') {
  await serveHttp(Number(arg));
} else {
  process.stderr.write('usage: mcp-conformance-server.mjs --stdio | --http PORT\n');
  process.exit(2);
}

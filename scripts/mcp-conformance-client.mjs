// The client side for scripts/mcp-conformance's client scenarios: the suite starts a test server
// over Streamable HTTP and runs this with its URL as the last argument.
//
//   node mcp-conformance-client.mjs URL            the driver: an MCP client (TypeScript SDK) on
//       stdio that initializes, lists the tools and calls each one (elicitation requests are
//       accepted with empty content and the SDK applies the schema's defaults). Its server is
//       `idemgate mcp --config $MCP_CONFORMANCE_CONFIG -- <this file> --bridge URL` when
//       MCP_CONFORMANCE_VIA=proxy (binary in IDEMGATE_BIN), else the bridge alone (the baseline).
//   node mcp-conformance-client.mjs --bridge URL   a message relay from stdio to the suite's
//       Streamable HTTP server (the SDK's client transport: sessions, SSE, reconnection), because
//       the proxy's upstream side speaks stdio only. Frames pass unread, except that the answer
//       to initialize sets the transport's protocol version header.
//
// So through the proxy the suite's server sees the driver's initialize, tools/list and tools/call
// as idemgate relays them, and the driver sees the server's requests as idemgate relays them back.
import { fileURLToPath } from 'node:url';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const SELF = fileURLToPath(import.meta.url);

/** Arguments for a tool from its input schema: 1 for numbers, "x" for strings, true for booleans. */
function argsFor(schema) {
  const args = {};
  for (const [name, prop] of Object.entries(schema?.properties ?? {})) {
    const type = Array.isArray(prop.type) ? prop.type[0] : prop.type;
    args[name] = type === 'number' || type === 'integer' ? 1 : type === 'boolean' ? true : 'x';
  }
  return args;
}

async function drive(url) {
  const upstream = [process.execPath, SELF, '--bridge', url];
  const via = process.env.MCP_CONFORMANCE_VIA;
  let command;
  if (via === 'proxy') {
    const bin = process.env.IDEMGATE_BIN;
    const config = process.env.MCP_CONFORMANCE_CONFIG;
    if (!bin || !config) throw new Error('MCP_CONFORMANCE_VIA=proxy needs IDEMGATE_BIN and MCP_CONFORMANCE_CONFIG');
    command = [bin, 'mcp', '--config', config, '--', ...upstream];
  } else if (via === 'direct') {
    command = upstream;
  } else {
    throw new Error(`MCP_CONFORMANCE_VIA must be proxy or direct, not ${via}`);
  }
  const transport = new StdioClientTransport({
    command: command[0],
    args: command.slice(1),
    env: process.env,
    stderr: 'inherit',
  });
  const client = new Client(
    { name: 'idemgate-conformance-driver', version: '1.0.0' },
    { capabilities: { elicitation: { form: { applyDefaults: true } } } },
  );
  client.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'accept', content: {} }));
  await client.connect(transport);
  const { tools } = await client.listTools();
  for (const tool of tools) {
    const result = await client.callTool({ name: tool.name, arguments: argsFor(tool.inputSchema) });
    process.stderr.write(`driver: ${tool.name} -> ${JSON.stringify(result).slice(0, 300)}\n`);
  }
  await client.close();
}

async function bridge(url) {
  const stdio = new StdioServerTransport();
  const http = new StreamableHTTPClientTransport(new URL(url));
  const initializeIds = new Set();
  let closing = false;
  const close = async () => {
    if (closing) return;
    closing = true;
    await http.close().catch(() => {});
    process.exit(0);
  };
  http.onmessage = (m) => {
    if ('id' in m && initializeIds.delete(m.id) && m.result?.protocolVersion) {
      http.setProtocolVersion(m.result.protocolVersion);
    }
    stdio.send(m).catch((e) => process.stderr.write(`bridge: to stdio: ${e}\n`));
  };
  http.onerror = (e) => process.stderr.write(`bridge: http: ${e}\n`);
  stdio.onmessage = async (m) => {
    if (m.method === 'initialize' && 'id' in m) initializeIds.add(m.id);
    try {
      await http.send(m);
    } catch (e) {
      process.stderr.write(`bridge: to http: ${e}\n`);
      if ('id' in m && m.method) {
        await stdio.send({ jsonrpc: '2.0', id: m.id, error: { code: -32603, message: `bridge: ${e}` } });
      }
    }
  };
  process.stdin.on('end', close);
  await http.start();
  await stdio.start();
}

const argv = process.argv.slice(2);
if (argv[0] === '--bridge' && argv[1]) {
  await bridge(argv[1]);
} else if (argv.length >= 1) {
  await drive(argv.at(-1));
} else {
  process.stderr.write('usage: mcp-conformance-client.mjs [--bridge] URL\n');
  process.exit(2);
}

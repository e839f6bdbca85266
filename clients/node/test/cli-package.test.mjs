// The `idemgate` binary through npm: the package's `bin` launcher and the per-platform package
// carrying the binary (the esbuild/biome pattern), packed with `npm pack` and installed from the
// tarballs (offline) into a fresh project, then `idemgate exec` and `idemgate mcp -- …` run
// through `node_modules/.bin/idemgate` as `npx idemgate` runs them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readFileSync, writeFileSync, chmodSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { scratch, within } from './helpers.mjs';

const run = promisify(execFile);
const PKG = fileURLToPath(new URL('..', import.meta.url));
const BIN = process.env.IDEMGATE_BIN;
const MAIL_SERVER = fileURLToPath(new URL('./fixtures/mail-server.mjs', import.meta.url));

/** A fresh project with the packed `idemgate` and `@idemgate/cli-linux-x64` installed. */
async function installed() {
  assert.ok(BIN && existsSync(BIN), `IDEMGATE_BIN (${BIN}) must name the idemgate binary: scripts/test-node sets it`);
  const dir = scratch();
  const cli = path.join(dir, 'cli-linux-x64');
  mkdirSync(path.join(cli, 'bin'), { recursive: true });
  copyFileSync(path.join(PKG, 'npm/linux-x64/package.json'), path.join(cli, 'package.json'));
  copyFileSync(BIN, path.join(cli, 'bin/idemgate'));
  chmodSync(path.join(cli, 'bin/idemgate'), 0o755);
  const pack = async (from) => {
    const { stdout } = await within(run('npm', ['pack', '--silent', '--pack-destination', dir], { cwd: from, maxBuffer: 1 << 24 }), `npm pack in ${from}`, 300_000);
    return path.join(dir, stdout.trim().split('\n').pop());
  };
  const tarballs = [await pack(PKG), await pack(cli)];
  const project = path.join(dir, 'project');
  mkdirSync(project);
  writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'agent', private: true }));
  await within(run('npm', ['install', '--offline', '--no-audit', '--no-fund', '--silent', ...tarballs], { cwd: project }), 'npm install of the tarballs', 300_000);
  return { dir, launcher: path.join(project, 'node_modules/.bin/idemgate') };
}

test('npx idemgate runs the platform package binary: exec once per key, and mcp in front of a server', async () => {
  const { dir, launcher } = await installed();
  const store = `sqlite://${path.join(dir, 'idemgate.db')}`;
  const common = ['--store', store, '--journal', path.join(dir, 'journal'), '--tenant', 'npx'];
  const env = { ...process.env, IDEMGATE_BIN: '' }; // the launcher must find the package's binary itself

  const exec = (key) => run(launcher, [...common, 'exec', '--key', key, '--', 'sh', '-c', `echo ran >> ${path.join(dir, 'ran')}; echo done`], { env });
  const first = await within(exec('job-1'), 'idemgate exec');
  const again = await within(exec('job-1'), 'idemgate exec again');
  assert.equal(first.stdout, 'done\n');
  assert.equal(again.stdout, 'done\n');
  assert.match(again.stderr, /replayed the outcome of job-1/);
  assert.equal(readFileSync(path.join(dir, 'ran'), 'utf8'), 'ran\n');

  const outbox = path.join(dir, 'outbox');
  const transport = new StdioClientTransport({
    command: launcher,
    args: [...common, 'mcp', '--', process.execPath, MAIL_SERVER, outbox],
    env: { ...env, PATH: process.env.PATH },
    cwd: PKG, // the fixture imports the SDK from the package's dev dependencies
    stderr: 'inherit',
  });
  const client = new Client({ name: 'agent', version: '1.0.0' });
  await within(client.connect(transport), 'the proxy to initialize');
  try {
    const call = () => client.callTool({ name: 'send_email', arguments: { to: 'ann@example.com' }, _meta: { 'dev.idemgate/idempotency-key': 'mail-1' } });
    const sent = await within(call(), 'the first call');
    const replay = await within(call(), 'the second call');
    assert.equal(sent.content[0].text, 'sent to ann@example.com');
    assert.equal(replay.content[0].text, 'sent to ann@example.com');
    assert.equal(readFileSync(outbox, 'utf8'), 'ann@example.com\n');
  } finally {
    await client.close();
  }
});

test("the README's example in a fresh project that installed the packed package, on a SQLite file, from two processes", async () => {
  const { dir, launcher } = await installed();
  const project = path.dirname(path.dirname(path.dirname(launcher)));
  const readme = readFileSync(path.join(PKG, 'README.md'), 'utf8');
  const db = path.join(dir, 'example.db');
  const example = readme.match(/```js\n([\s\S]*?)```/)[1]
    .replace("Engine.open('memory:')", `Engine.open('sqlite://${db}', { journal: '${path.join(dir, 'journal')}' })`);
  assert.ok(example.includes(db), 'the example opens the engine with Engine.open(\'memory:\')');
  const file = path.join(project, 'example.mjs');
  writeFileSync(file, example);
  const once = async () => (await within(run(process.execPath, [file], { cwd: project }), 'the example to run')).stdout.trim().split('\n');
  const first = await once();
  assert.deepEqual(first, [
    "{ chargeId: 'ch-order-1', amount: 12 }",
    "{ chargeId: 'ch-order-1', amount: 12 }",
    'true true 1',
    'the bank timed out',
    'true',
  ]);
  // Another process on the same file: nothing runs again; the unknown outcome stays unknown.
  const second = await once();
  assert.deepEqual(second.slice(0, 3), [
    "{ chargeId: 'ch-order-1', amount: 12 }",
    "{ chargeId: 'ch-order-1', amount: 12 }",
    'true true 0',
  ]);
  assert.match(second[3], /wire\/w-1 is unknown/);
  assert.equal(second[4], 'true');
});

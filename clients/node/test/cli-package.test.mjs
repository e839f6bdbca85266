// The package as npm users get it: the `idemgate` package and its platform package (the addon and
// the `idemgate` binary, the @swc/biome pattern) packed by scripts/npm-packages.mjs as
// scripts/release packs them, installed from the tarballs (offline) into a fresh project; then
// `idemgate exec` and `idemgate mcp -- …` through `node_modules/.bin/idemgate` as `npx idemgate`
// runs them, and the README's example. Also: what a missing platform package says, and
// `npm install ./clients/node` from a checkout (its install script builds the addon with cargo,
// or says what to run).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFileSync, cpSync, existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { packNpm } from '../../../scripts/npm-packages.mjs';
import { scratch, within } from './helpers.mjs';

const run = promisify(execFile);
const PKG = fileURLToPath(new URL('..', import.meta.url));
const ROOT = path.resolve(PKG, '..', '..');
const BIN = process.env.IDEMGATE_BIN;
const ADDON = path.join(PKG, `idemgate.${process.platform}-${process.arch}.node`);
const VERSION = JSON.parse(readFileSync(path.join(PKG, 'package.json'), 'utf8')).version;
const MAIL_SERVER = fileURLToPath(new URL('./fixtures/mail-server.mjs', import.meta.url));

/** A fresh project with `packages` (tarballs, or a folder) installed offline into it. */
async function project(dir, packages, env = process.env) {
  const where = path.join(dir, 'project');
  mkdirSync(where);
  writeFileSync(path.join(where, 'package.json'), JSON.stringify({ name: 'agent', private: true }));
  await within(run('npm', ['install', '--offline', '--no-audit', '--no-fund', '--loglevel=error', ...packages], { cwd: where, env }), 'npm install', 300_000);
  return where;
}

/** The tarballs of the `idemgate` package and of this platform's package, packed as a release packs them. */
function tarballs(dir) {
  assert.ok(BIN && existsSync(BIN), `IDEMGATE_BIN (${BIN}) must name the idemgate binary: scripts/test-node sets it`);
  assert.ok(existsSync(ADDON), `${ADDON} must be built: scripts/test-node builds it`);
  return packNpm({ out: dir, version: VERSION, platforms: [{ id: 'linux-x64-gnu', addon: ADDON, binary: BIN }] });
}

/** A fresh project with the packed `idemgate` and `@idemgate/linux-x64-gnu` installed. */
async function installed() {
  const dir = scratch();
  const where = await project(dir, tarballs(dir));
  return { dir, launcher: path.join(where, 'node_modules/.bin/idemgate') };
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

test("the package's version is the Cargo workspace's, the one every artifact carries", () => {
  const cargo = readFileSync(path.join(ROOT, 'Cargo.toml'), 'utf8');
  const workspace = cargo.slice(cargo.indexOf('[workspace.package]'));
  assert.equal(VERSION, workspace.match(/^version = "(.*)"$/m)[1], 'clients/node/package.json and Cargo.toml must say one version');
});

test('the packed packages carry one version, the main one no addon and no install script, the platform one both native pieces', async () => {
  const dir = scratch();
  const [main, platform] = tarballs(dir);
  assert.equal(path.basename(main), `idemgate-${VERSION}.tgz`);
  assert.equal(path.basename(platform), `idemgate-linux-x64-gnu-${VERSION}.tgz`);
  const list = async (tgz) => (await run('tar', ['-tzf', tgz])).stdout.trim().split('\n').sort();
  const mainFiles = await list(main);
  assert.ok(mainFiles.includes('package/native.cjs') && mainFiles.includes('package/platform.cjs') && mainFiles.includes('package/bin/idemgate.cjs'));
  assert.ok(!mainFiles.some((f) => f.endsWith('.node') || f.endsWith('install.cjs')), mainFiles.join(' '));
  assert.deepEqual(await list(platform), ['package/README.md', 'package/bin/idemgate', 'package/idemgate.node', 'package/package.json']);
  const manifest = async (tgz) => JSON.parse((await run('tar', ['-xzOf', tgz, 'package/package.json'])).stdout);
  const m = await manifest(main);
  assert.equal(m.version, VERSION);
  assert.deepEqual(m.optionalDependencies, { '@idemgate/linux-x64-gnu': VERSION });
  assert.equal(m.scripts, undefined, 'the published package builds nothing at install');
  assert.equal(m.devDependencies, undefined);
  const p = await manifest(platform);
  assert.deepEqual([p.name, p.version, p.os, p.cpu, p.libc, p.main], ['@idemgate/linux-x64-gnu', VERSION, ['linux'], ['x64'], ['glibc'], 'idemgate.node']);
});

test('without its platform package the package names the missing package and what to do, for the engine and for npx', async () => {
  const dir = scratch();
  const [main] = tarballs(dir);
  const where = await project(dir, [main]);
  const env = { ...process.env, IDEMGATE_BIN: '', IDEMGATE_NODE_ADDON: '' };
  const engine = await run(process.execPath, ['-e', "require('idemgate')"], { cwd: where, env }).then(
    () => assert.fail('the engine loaded without its addon'),
    (e) => e.stderr,
  );
  assert.match(engine, /no native engine for linux-x64-gnu: the package @idemgate\/linux-x64-gnu is not installed/);
  assert.match(engine, /--omit=optional/);
  assert.match(engine, /IDEMGATE_NODE_ADDON/);
  const npx = await run(path.join(where, 'node_modules/.bin/idemgate'), ['--version'], { env }).then(
    () => assert.fail('npx idemgate ran without its binary'),
    (e) => e,
  );
  assert.equal(npx.code, 127);
  assert.match(npx.stderr, /no idemgate binary for linux-x64-gnu: the package @idemgate\/linux-x64-gnu is not installed/);
  assert.match(npx.stderr, /cargo install --locked --path crates\/idemgate-cli/);
});

/** clients/node as a checkout has it, without a built addon, in a fresh folder (the real
 * checkout's addon stays where the other tests load it). */
function checkoutCopy() {
  const copy = path.join(scratch(), 'node');
  mkdirSync(copy);
  for (const name of readdirSync(PKG)) {
    if (/\.(cjs|mjs|d\.ts|json|md)$/.test(name) && name !== 'package-lock.json') copyFileSync(path.join(PKG, name), path.join(copy, name));
  }
  cpSync(path.join(PKG, 'bin'), path.join(copy, 'bin'), { recursive: true });
  return copy;
}

test("npm install of a checkout's clients/node builds the addon with cargo, then the README's example runs", async () => {
  const copy = checkoutCopy();
  // The dev profile scripts/test-node has just built: cargo finds it up to date.
  const env = { ...process.env, IDEMGATE_SOURCE: ROOT, IDEMGATE_BUILD_PROFILE: 'dev', IDEMGATE_NODE_ADDON: '' };
  const where = await project(path.dirname(copy), [copy], env);
  assert.ok(existsSync(path.join(copy, path.basename(ADDON))), 'the install script put the addon beside native.cjs');
  const readme = readFileSync(path.join(PKG, 'README.md'), 'utf8');
  writeFileSync(path.join(where, 'example.mjs'), readme.match(/```js\n([\s\S]*?)```/)[1]);
  const { stdout } = await within(run(process.execPath, ['example.mjs'], { cwd: where, env }), 'the example to run');
  assert.deepEqual(stdout.trim().split('\n').slice(0, 3), [
    "{ chargeId: 'ch-order-1', amount: 12 }",
    "{ chargeId: 'ch-order-1', amount: 12 }",
    'true true 1',
  ]);
});

test("npm install of a checkout's clients/node without cargo says exactly what to run", async () => {
  const copy = checkoutCopy();
  const PATH = process.env.PATH.split(path.delimiter).filter((d) => !existsSync(path.join(d, 'cargo'))).join(path.delimiter);
  const env = { ...process.env, PATH, IDEMGATE_SOURCE: ROOT, IDEMGATE_NODE_ADDON: '' };
  const failed = await project(path.dirname(copy), [copy], env).then(
    () => assert.fail('the install succeeded without an addon and without cargo'),
    (e) => `${e.stdout}\n${e.stderr}`,
  );
  assert.match(failed, /the native engine is not built and cargo is not on PATH/);
  assert.match(failed, /cargo build --locked --profile release -p idemgate-node/);
  assert.ok(!existsSync(path.join(copy, path.basename(ADDON))));
});

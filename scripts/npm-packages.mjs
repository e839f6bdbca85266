#!/usr/bin/env node
// The npm packages of a release, as `npm pack` tarballs (the @swc/biome pattern):
// - `idemgate`: clients/node without its checkout-only pieces (the install script that builds the
//   addon with cargo, the dev dependencies), naming one optional dependency per platform built;
// - `@idemgate/<platform>` per platform: that platform's addon (`idemgate.node`, its `main`) and
//   `idemgate` binary (`bin/idemgate`; `bin/idemgate.exe` for win32), with `os`, `cpu` and `libc`
//   set so npm installs only the one that matches (clients/node/platform.cjs names the same packages).
// Every package carries the one version given (scripts/release passes the workspace's).
//
// Usage: node scripts/npm-packages.mjs --out DIR --version V --platform ID=ADDON,BINARY [...]
//   e.g. --platform linux-x64-gnu=target/x/libidemgate_node.so,target/y/idemgate
// Prints the tarballs' paths, one per line, the `idemgate` package first.
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, cpSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const PKG = fileURLToPath(new URL('../clients/node/', import.meta.url));
const { binaryPath } = createRequire(import.meta.url)('../clients/node/platform.cjs');
// What npm's `os`, `cpu` and `libc` fields say for each platform id of platform.cjs.
const FIELDS = {
  'linux-x64-gnu': { os: ['linux'], cpu: ['x64'], libc: ['glibc'] },
  'linux-x64-musl': { os: ['linux'], cpu: ['x64'], libc: ['musl'] },
  'linux-arm64-gnu': { os: ['linux'], cpu: ['arm64'], libc: ['glibc'] },
  'linux-arm64-musl': { os: ['linux'], cpu: ['arm64'], libc: ['musl'] },
  'win32-x64': { os: ['win32'], cpu: ['x64'] },
  'darwin-x64': { os: ['darwin'], cpu: ['x64'] },
  'darwin-arm64': { os: ['darwin'], cpu: ['arm64'] },
};

/** The packages for `platforms` ([{ id, addon, binary }]) at `version`, packed into `out`. */
export function packNpm({ out, version, platforms }) {
  if (!/^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$/.test(version)) throw new Error(`not a version: ${version}`);
  if (platforms.length === 0) throw new Error('no platform given: every release carries at least one');
  mkdirSync(out, { recursive: true });
  const stage = mkdtempSync(path.join(tmpdir(), 'idemgate-npm-'));
  try {
    const tarballs = [packMain(stage, out, version, platforms.map((p) => p.id))];
    for (const p of platforms) tarballs.push(packPlatform(stage, out, version, p));
    return tarballs;
  } finally {
    rmSync(stage, { recursive: true, force: true });
  }
}

function packMain(stage, out, version, ids) {
  const dir = path.join(stage, 'idemgate');
  const manifest = JSON.parse(readFileSync(path.join(PKG, 'package.json'), 'utf8'));
  mkdirSync(dir);
  for (const name of readdirSync(PKG)) {
    // The files the manifest ships, less the checkout's build of the addon and its builder.
    if (/\.(cjs|mjs|d\.ts)$/.test(name) && name !== 'install.cjs') copyFileSync(path.join(PKG, name), path.join(dir, name));
  }
  cpSync(path.join(PKG, 'bin'), path.join(dir, 'bin'), { recursive: true });
  copyFileSync(path.join(PKG, 'README.md'), path.join(dir, 'README.md'));
  manifest.version = version;
  manifest.files = manifest.files.filter((f) => f !== '*.node');
  delete manifest.scripts;
  delete manifest.devDependencies;
  manifest.optionalDependencies = Object.fromEntries(ids.map((id) => [`@idemgate/${id}`, version]));
  writeFileSync(path.join(dir, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  return pack(dir, out);
}

function packPlatform(stage, out, version, { id, addon, binary }) {
  const fields = FIELDS[id];
  if (!fields) throw new Error(`unknown platform ${id}: one of ${Object.keys(FIELDS).join(', ')}`);
  const dir = path.join(stage, id);
  const bin = binaryPath(id);
  mkdirSync(path.join(dir, 'bin'), { recursive: true });
  copyFileSync(addon, path.join(dir, 'idemgate.node'));
  copyFileSync(binary, path.join(dir, bin));
  chmodSync(path.join(dir, bin), 0o755);
  const manifest = {
    name: `@idemgate/${id}`,
    version,
    description: `The idemgate native engine (Node addon) and idemgate binary for ${id}, installed by the idemgate package as an optional dependency`,
    license: 'Apache-2.0',
    ...fields,
    main: 'idemgate.node',
    files: ['idemgate.node', bin],
    preferUnplugged: true,
  };
  writeFileSync(path.join(dir, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  writeFileSync(
    path.join(dir, 'README.md'),
    `# @idemgate/${id}\n\nThe native pieces of the [idemgate](https://www.npmjs.com/package/idemgate) package for ${id}: ` +
      `the engine as a Node addon (\`idemgate.node\`) and the \`idemgate\` command line (\`${bin}\`). ` +
      'Install `idemgate`, which depends on this package for this platform; do not depend on it directly.\n',
  );
  return pack(dir, out);
}

function pack(dir, out) {
  const stdout = execFileSync('npm', ['pack', '--silent', '--pack-destination', out], { cwd: dir, encoding: 'utf8', maxBuffer: 1 << 24 });
  return path.join(out, stdout.trim().split('\n').pop());
}

if (process.argv[1] && fileURLToPath(import.meta.url) === path.resolve(process.argv[1])) {
  const args = process.argv.slice(2);
  let out;
  let version;
  const platforms = [];
  for (let i = 0; i < args.length; i += 2) {
    const [flag, value] = [args[i], args[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === '--out') out = value;
    else if (flag === '--version') version = value;
    else if (flag === '--platform') {
      const m = value.match(/^([^=]+)=([^,]+),(.+)$/);
      if (!m) throw new Error(`--platform ID=ADDON,BINARY, not ${value}`);
      platforms.push({ id: m[1], addon: m[2], binary: m[3] });
    } else throw new Error(`unknown argument ${flag} (usage: --out DIR --version V --platform ID=ADDON,BINARY ...)`);
  }
  if (!out || !version) throw new Error('--out and --version are required');
  for (const t of packNpm({ out, version, platforms })) console.log(t);
}

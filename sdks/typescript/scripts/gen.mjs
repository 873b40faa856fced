#!/usr/bin/env node
// Generates src/gen/ (typed messages and @grpc/grpc-js clients) from the repository's
// proto/cyclone/v1/*.proto, with the tool versions pinned in package.json (installed by
// `npm ci`): buf compiles the protos, ts-proto writes the TypeScript.
//
//   npm run gen                       # rewrites src/gen/
//   node scripts/gen.mjs --out DIR    # writes into DIR instead (the staleness test does)
//
// The output depends only on the protos and these versions: test/gen.test.ts regenerates
// into a temporary folder and fails when anything differs from the committed src/gen/.

import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const pkgDir = resolve(here, '..');
const protoDir = resolve(pkgDir, '../../proto');

// ts-proto options: grpc-js clients and service definitions; int64 as number (it throws
// past 2^53, which no Cyclone counter reaches); Timestamp as Date; ESM imports with .js.
export const TS_PROTO_OPTIONS = [
  'outputServices=grpc-js',
  'env=node',
  'esModuleInterop=true',
  'importSuffix=.js',
  'outputJsonMethods=false',
  'useDate=true',
  'forceLong=number',
];

/** Fails unless the installed generator versions are those package.json pins. */
export function checkPinnedVersions() {
  const pkg = JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8'));
  for (const name of ['@bufbuild/buf', 'ts-proto']) {
    const want = pkg.devDependencies[name];
    const have = JSON.parse(readFileSync(join(pkgDir, 'node_modules', name, 'package.json'), 'utf8')).version;
    if (want !== have) {
      throw new Error(`${name} ${have} is installed, package.json pins ${want}: run npm ci`);
    }
  }
}

/** Writes the generated code for every proto/cyclone/v1/*.proto into `outDir` (emptied first). */
export function generate(outDir) {
  checkPinnedVersions();
  rmSync(outDir, { recursive: true, force: true });
  mkdirSync(outDir, { recursive: true });
  const template = {
    version: 'v2',
    plugins: [{
      local: [process.execPath, join(pkgDir, 'node_modules/ts-proto/protoc-gen-ts_proto')],
      out: outDir,
      opt: TS_PROTO_OPTIONS,
    }],
  };
  const buf = join(pkgDir, 'node_modules/@bufbuild/buf/bin/buf');
  execFileSync(process.execPath, [buf, 'generate', protoDir, '--template', JSON.stringify(template)], {
    cwd: pkgDir,
    stdio: ['ignore', 'inherit', 'inherit'],
    // buf keeps a cache; in the package's node_modules, not in the home folder.
    env: { ...process.env, BUF_CACHE_DIR: join(pkgDir, 'node_modules/.cache/buf') },
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const i = process.argv.indexOf('--out');
  const out = i > 0 ? resolve(process.argv[i + 1]) : join(pkgDir, 'src/gen');
  generate(out);
  process.stderr.write(`gen: wrote ${out}\n`);
}

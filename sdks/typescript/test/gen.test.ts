// The generated code in src/gen/ is what scripts/gen.mjs makes from ../../proto with the
// pinned generator versions: regenerating changes nothing (else run `npm run gen`).

import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';

const pkgDir = fileURLToPath(new URL('../../', import.meta.url));

function files(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile())
    .map((e) => relative(dir, join(e.parentPath, e.name)))
    .sort();
}

describe('src/gen', () => {
  it('is up to date with proto/ (npm run gen changes nothing)', async () => {
    const { generate } = await import(pathToFileURL(join(pkgDir, 'scripts/gen.mjs')).href);
    const out = mkdtempSync(join(tmpdir(), 'cyclone-gen-'));
    try {
      generate(out);
      const committed = join(pkgDir, 'src/gen');
      assert.deepEqual(files(committed), files(out), 'the generated files differ from src/gen: run npm run gen');
      for (const f of files(out)) {
        assert.ok(readFileSync(join(out, f), 'utf8') === readFileSync(join(committed, f), 'utf8'),
          `src/gen/${f} is stale: run npm run gen`);
      }
      assert.ok(files(out).includes(join('cyclone', 'v1', 'workers.ts')));
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});

// Builds the dashboard: bundles src/main.js (with uPlot and the CSS) into
// content-hashed files and writes index.html pointing at them.
//   node web/build.mjs [OUTDIR]      (default: build/web/dist at the repo root)
// The coordinator serves OUTDIR (--web-dir); hashed names are cached for a
// year, index.html is revalidated on every load.
import * as esbuild from 'esbuild';
import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync, renameSync } from 'node:fs';
import { dirname, join, resolve, basename } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] || join(here, '..', 'build', 'web', 'dist'));
const tmp = `${out}.tmp`;
rmSync(tmp, { recursive: true, force: true });
mkdirSync(tmp, { recursive: true });

const result = await esbuild.build({
  entryPoints: [join(here, 'src', 'main.js')],
  bundle: true,
  format: 'esm',
  target: ['es2020', 'chrome100', 'firefox100', 'safari15'],
  minify: true,
  sourcemap: false,
  outdir: tmp,
  entryNames: '[name]-[hash]',
  assetNames: '[name]-[hash]',
  metafile: true,
  logLevel: 'warning',
  legalComments: 'linked',
});

const outputs = Object.keys(result.metafile.outputs).map((p) => basename(p));
const js = outputs.find((n) => /^main-[A-Z0-9]{8}\.js$/.test(n));
const css = outputs.find((n) => /^main-[A-Z0-9]{8}\.css$/.test(n));
if (!js || !css) {
  console.error(`web/build.mjs: expected main-HASH.js and main-HASH.css, got ${outputs.join(', ')}`);
  process.exit(1);
}
const html = readFileSync(join(here, 'index.html'), 'utf8').replace('{{JS}}', js).replace('{{CSS}}', css);
writeFileSync(join(tmp, 'index.html'), html);
rmSync(out, { recursive: true, force: true });
renameSync(tmp, out);
console.log(`web: ${out}: ${readdirSync(out).join(' ')}`);

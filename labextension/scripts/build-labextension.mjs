#!/usr/bin/env node
/**
 * Build the prebuilt extension into `jupyterlab.outputDir` (../elasticdl_nb/labextension)
 * with @jupyterlab/builder, as `jupyter labextension build` does, but with no Python:
 * the core data the builder needs (which packages JupyterLab shares, at what versions)
 * comes from @jupyterlab/core-meta, a devDependency. JupyterLab 4.6's own command would
 * also refuse Node.js older than 20.19 (Debian 12 has 18), which this builder runs on.
 *
 *     node scripts/build-labextension.mjs [--development] [--source-map] [--watch]
 */
import { spawnSync } from 'node:child_process';
import {
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const extension = dirname(dirname(fileURLToPath(import.meta.url)));
const modules = join(extension, 'node_modules');
const pkg = JSON.parse(readFileSync(join(extension, 'package.json'), 'utf8'));
const outputDir = resolve(extension, pkg.jupyterlab.outputDir);

// The builder reads the core data as `package.json` in the directory it is given.
const corePath = mkdtempSync(join(tmpdir(), 'elasticdl-nb-core-'));
copyFileSync(
  join(modules, '@jupyterlab', 'core-meta', 'core.package.json'),
  join(corePath, 'package.json')
);

// install.json tells JupyterLab which Python package brought the extension.
const copyInstallJson = () => {
  mkdirSync(outputDir, { recursive: true });
  copyFileSync(
    join(extension, 'install.json'),
    join(outputDir, 'install.json')
  );
};

const args = process.argv.slice(2);
if (args.includes('--watch')) {
  copyInstallJson(); // the builder keeps the directory while it watches
}
try {
  const builder = join(
    modules,
    '@jupyterlab',
    'builder',
    'lib',
    'build-labextension.js'
  );
  const run = spawnSync(
    process.execPath,
    [builder, '--core-path', corePath, ...args, extension],
    { stdio: 'inherit' }
  );
  if (run.status !== 0) {
    process.exit(run.status ?? 1);
  }
  copyInstallJson();
} finally {
  rmSync(corePath, { recursive: true, force: true });
}

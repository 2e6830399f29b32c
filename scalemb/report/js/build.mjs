// Builds ../vendor/regl-scatterplot.min.js (one minified IIFE: regl-scatterplot and every dependency it imports)
// and ../vendor/regl-scatterplot.LICENSES.txt (the licence file of each bundled package, with name and version).
// Reproducible: `npm ci && npm run build` with the pinned versions of package-lock.json.
import { build } from "esbuild";
import { readFileSync, readdirSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const vendor = join(here, "..", "vendor");
mkdirSync(vendor, { recursive: true });
const result = await build({
  entryPoints: [join(here, "entry.js")],
  bundle: true,
  minify: true,
  format: "iife",
  target: "es2020",
  legalComments: "none",
  metafile: true,
  loader: { ".fs": "js", ".vs": "js" },
  outfile: join(vendor, "regl-scatterplot.min.js"),
});
const packages = new Set();
for (const input of Object.keys(result.metafile.inputs)) {
  const m = input.match(/node_modules\/((?:@[^/]+\/)?[^/]+)\//);
  if (m) packages.add(m[1]);
}
// regl-scatterplot's src/kdbush-class.js is a copy of kdbush (ISC): its licence comes from the kdbush package
// (a devDependency for that reason only).
packages.add("kdbush");
const parts = [];
for (const name of [...packages].sort()) {
  const root = join(here, "node_modules", name);
  const { version, license } = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
  const files = readdirSync(root).filter((f) => /^(licen[cs]e|copying)/i.test(f));
  if (!files.length) throw new Error(`${name}: no licence file to vendor`);
  parts.push(`==== ${name}@${version} (${license}) ====\n\n` +
             files.map((f) => readFileSync(join(root, f), "utf8").trim()).join("\n\n"));
}
writeFileSync(join(vendor, "regl-scatterplot.LICENSES.txt"),
              "Licences of the packages bundled into regl-scatterplot.min.js (built by scalemb/report/js).\n\n" +
              parts.join("\n\n") + "\n");
console.log(`bundled ${packages.size} packages: ${[...packages].sort().join(", ")}`);

// jinja_hf_render.mjs - renders a template with npm's @huggingface/jinja for
// jinja_ref_check.py: `node jinja_hf_render.mjs PACKAGE_DIR TEMPLATE CONTEXTS.json` writes one
// JSON line per context, {"out": TEXT} or {"error": MESSAGE}. strftime_now and
// raise_exception are the package's own; its clock is fixed at jinja_render's time
// (2024-07-26 12:00:00, local time).
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

// The package defines strftime_now on the current date: fix "now" as jinja_render does.
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...a) {
    super(...(a.length ? a : [2024, 6, 26, 12, 0, 0]));
  }
  static now() {
    return new RealDate(2024, 6, 26, 12, 0, 0).getTime();
  }
};

const [pkg, tpath, cpath] = process.argv.slice(2);
const { Template } = await import(pathToFileURL(path.join(pkg, "dist", "index.js")).href);
const src = readFileSync(tpath, "utf8");
const contexts = JSON.parse(readFileSync(cpath, "utf8"));
let tmpl = null, parseError = null;
try {
  tmpl = new Template(src);
} catch (e) {
  parseError = String(e && e.message ? e.message : e);
}
for (const ctx of contexts) {
  let line;
  if (parseError) {
    line = { error: parseError };
  } else {
    try {
      // the package declares raise_exception and strftime_now itself
      const vars = Object.assign({}, ctx);
      line = { out: tmpl.render(vars) };
    } catch (e) {
      line = { error: String(e && e.message ? e.message : e) };
    }
  }
  process.stdout.write(JSON.stringify(line) + "\n");
}

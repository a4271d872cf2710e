// tokref.mjs - extract tiktoken-format rank files from the npm reference tokenizers and
// write their token ids for the tokenizer test corpus (run by scripts/tokref.sh).
//
//   node scripts/tokref.mjs NODE_MODULES OUT_DIR CORPUS_DIR
//
// Writes into OUT_DIR:
//   cl100k_base.tiktoken, o200k_base.tiktoken  from js-tiktoken's bundled ranks
//   llama3.tiktoken                            from llama3-tokenizer-js's vocabulary (its
//                                              byte-level strings mapped back to bytes)
//   NAME.tiktoken.json                         sidecars naming the kind (src/cli/tok/bpe.h)
//   cl100k_im.tiktoken(.json)                  cl100k ranks with ChatML's markers added as
//                                              specials (100264, 100265), for the templates
//   expected.txt                               one line per (kind, mode, corpus file):
//                                              "KIND MODE FILE N id id ..."; MODE is
//                                              "special" (special-token text becomes the
//                                              special token) or "text" (it is ordinary text)
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, outDir, corpusDir] = process.argv.slice(2);
if (!modules || !outDir || !corpusDir) {
  console.error("usage: node tokref.mjs NODE_MODULES OUT_DIR CORPUS_DIR");
  process.exit(2);
}
const require = createRequire(path.resolve(modules, "x.js"));
const { Tiktoken } = require("js-tiktoken/lite");
const ranks = {
  cl100k: require("js-tiktoken/ranks/cl100k_base"),
  o200k: require("js-tiktoken/ranks/o200k_base"),
};
const llamaMain = path.resolve(modules, "llama3-tokenizer-js", "bundle",
                            "llama3-tokenizer-with-baked-data.js");
const llamaMod = await import(pathToFileURL(llamaMain).href);
const llama = llamaMod.default;

// js-tiktoken's compressed ranks: lines "! OFFSET B64 B64 ...", rank = OFFSET + position.
function tiktokenLines(r) {
  const out = [];
  for (const line of r.bpe_ranks.split("\n")) {
    if (!line) continue;
    const [, offsetStr, ...toks] = line.split(" ");
    const offset = Number.parseInt(offsetStr, 10);
    toks.forEach((t, i) => out.push([offset + i, t]));
  }
  out.sort((a, b) => a[0] - b[0]);
  return out.map(([rank, t]) => `${t} ${rank}\n`).join("");
}

// GPT-2's byte <-> printable-character table, as the byte-level BPE vocabularies use it.
function unicodeToBytes() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n);
      n++;
    }
  }
  const m = new Map();
  bs.forEach((b, i) => m.set(String.fromCharCode(cs[i]), b));
  return m;
}

function llamaLines() {
  const u2b = unicodeToBytes();
  const lines = [];
  for (let id = 0; id < 128000; id++) {
    const s = llama.vocabById[id];
    const bytes = Buffer.from(Array.from(s, (c) => {
      const b = u2b.get(c);
      if (b === undefined) throw new Error(`token ${id}: character ${c} is not a byte`);
      return b;
    }));
    lines.push(`${bytes.toString("base64")} ${id}\n`);
  }
  return lines.join("");
}

fs.mkdirSync(outDir, { recursive: true });
const write = (name, text) => fs.writeFileSync(path.join(outDir, name), text);
write("cl100k_base.tiktoken", tiktokenLines(ranks.cl100k));
write("cl100k_base.tiktoken.json", JSON.stringify({ kind: "cl100k" }) + "\n");
write("o200k_base.tiktoken", tiktokenLines(ranks.o200k));
write("o200k_base.tiktoken.json", JSON.stringify({ kind: "o200k" }) + "\n");
write("llama3.tiktoken", llamaLines());
write("llama3.tiktoken.json", JSON.stringify({ kind: "llama3" }) + "\n");
write("cl100k_im.tiktoken", tiktokenLines(ranks.cl100k));
write("cl100k_im.tiktoken.json", JSON.stringify({
  kind: "cl100k", special_tokens: { "<|im_start|>": 100264, "<|im_end|>": 100265 },
}) + "\n");

const enc = {
  cl100k: new Tiktoken(ranks.cl100k),
  o200k: new Tiktoken(ranks.o200k),
};
const never = /(?!)/g;
function encode(kind, text, special) {
  if (kind === "llama3") {
    return special ? llama.encode(text, { bos: false, eos: false })
                   : llama.encode(text, { bos: false, eos: false, specialTokenRegex: never });
  }
  return special ? enc[kind].encode(text, "all") : enc[kind].encode(text, [], []);
}

const files = fs.readdirSync(corpusDir).filter((f) => !f.startsWith(".")).sort();
const out = [];
for (const f of files) {
  const text = fs.readFileSync(path.join(corpusDir, f), "utf8");
  for (const kind of ["cl100k", "o200k", "llama3"]) {
    for (const mode of ["special", "text"]) {
      const ids = encode(kind, text, mode === "special");
      out.push(`${kind} ${mode} ${f} ${ids.length} ${ids.join(" ")}\n`);
    }
  }
}
write("expected.txt", out.join(""));
console.log(`tokref: ${files.length} corpus files, 3 tokenizers -> ${outDir}`);

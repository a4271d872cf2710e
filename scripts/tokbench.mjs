// tokbench.mjs - the reference side of bench/bench_tokenize.c: encode the same text with
// js-tiktoken (cl100k, o200k) or llama3-tokenizer-js (llama3) and print the median MB/s.
//
//   node scripts/tokbench.mjs NODE_MODULES KIND FILE RUNS
//
// Prints "KIND MBPS TOKENS" (the median of RUNS timed encodes, after one warm-up, and the
// token count of one encode). FILE is the text bench_tokenize.c wrote: the corpus
// concatenated.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, kind, file, runsStr] = process.argv.slice(2);
const runs = Number.parseInt(runsStr ?? "5", 10);
const require = createRequire(path.resolve(modules, "x.js"));
let encode;
if (kind === "llama3") {
  const main = path.resolve(modules, "llama3-tokenizer-js", "bundle",
                            "llama3-tokenizer-with-baked-data.js");
  const llama = (await import(pathToFileURL(main).href)).default;
  encode = (t) => llama.encode(t, { bos: false, eos: false });
} else {
  const { Tiktoken } = require("js-tiktoken/lite");
  const ranks = require(`js-tiktoken/ranks/${kind === "cl100k" ? "cl100k_base" : "o200k_base"}`);
  const enc = new Tiktoken(ranks);
  encode = (t) => enc.encode(t, "all");
}
const text = fs.readFileSync(file, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
const n = encode(text).length;
const rates = [];
for (let i = 0; i < runs; i++) {
  const t0 = process.hrtime.bigint();
  encode(text);
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  rates.push(bytes / s / 1e6);
}
rates.sort((a, b) => a - b);
const med = runs % 2 ? rates[(runs - 1) / 2] : (rates[runs / 2 - 1] + rates[runs / 2]) / 2;
console.log(`${kind} ${med.toFixed(2)} ${n}`);

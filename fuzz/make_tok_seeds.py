#!/usr/bin/python3
"""make_tok_seeds.py - write the seed inputs of fuzz_tokenize and fuzz_template.

    /usr/bin/python3 fuzz/make_tok_seeds.py     (from the repository root)

Writes fuzz/corpus/tokenize/seed-NN and fuzz/corpus/template/seed-NN (overwriting those
names only; campaign inputs and regress-* files are left alone). The input formats are
described at the top of fuzz/fuzz_tokenize.c and fuzz/fuzz_template.c.

fuzz_tokenize: byte 0 is the mode (0: text, 2: piece, 3: vocabulary), then per mode a
flags byte (kind = (flags & 3) % 3: llama3, cl100k, o200k; specials = flags & 4, base = flags >> 3 & 3, dummies =
flags >> 5 & 3) and the text. Texts cover what tokenizers get wrong: contractions in
either case, code, CJK, emoji with modifiers, numbers, whitespace runs and CRLF, Unicode
White_Space (U+0085, U+00A0, U+202F), U+FEFF, combining marks, each kind's special
tokens, and invalid UTF-8 (overlong, surrogate, truncated, above U+10FFFF).
"""
import json
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

TEXTS = [
    "Hello world, the thebab 123456  \n\n",
    "I'll say he's DON'T we'RE they'Ve I'M you'LL it'D 'ſ",
    "def f(x):\n    return x  # comment\n\n\tif x:\r\n        pass\n",
    "日本語のテキスト、中文文本。한국어",
    "😀👍🏽 emoji 🇫🇷 family 👨‍👩‍👧",
    "1234567890 3.14159 -42 1e10 2024-05-17T12:34:56Z",
    "a   \n\n\t\t  b      \n \n  \r\n\r\n",
    "nel\u0085nbsp\u00a0narrow\u202fbom\ufeffideo\u3000end",
    "e\u0301 n\u0303 HelloWorld CamelCase ABCdef foo/bar\n/path",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><|endofprompt|>",
    "[INST] hi [/INST]<s></s>[TOOL_CALLS] <|reserved_special_token_247|>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",
    "abababababababababababababababababababababababababababababababababababababab",
    " " * 100 + "x" + "!" * 70 + "\n" * 40,
    b"ok\xff bad",
    b"over\xc0\xafx long",
    b"surrogate \xed\xa0\x80 x",
    b"big \xf4\x90\x80\x80",
    b"truncated \xe6\x97",
]


def write(target, i, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-%02d" % i), "wb") as f:
        f.write(data)


def text_bytes(t):
    return t if isinstance(t, bytes) else t.encode("utf-8")


def tokenize_seeds():
    n = 0
    for i, t in enumerate(TEXTS):
        flags = (i % 3) | (4 if i % 2 else 0) | ((i // 3 % 4) << 3) | ((i % 4) << 5)
        data = bytes([0, flags])
        if (flags >> 3) & 3 == 1:
            data += bytes([17])
        write("tokenize", n, data + text_bytes(t))
        n += 1
    # special tokens on, each kind with its own (cl100k: the sidecar's, one extending another)
    for flags, t in ((1 | 4, "[TOOL_CALLS] [x][TOOL_CALLS]y<|im_start|>a<|im_end|>\n<s>b</s>"),
                     (0 | 4, "<|begin_of_text|>x<|reserved_special_token_24|><|eot_id|>"),
                     (2 | 4, "a<|endofprompt|>b<|endoftext|><|endofprompt|")):
        write("tokenize", n, bytes([0, flags]) + t.encode("utf-8"))
        n += 1
    # piece mode: letters and spaces, long runs
    for flags, body in ((0, bytes(range(200))), (4, bytes(range(0, 256, 3)) * 2),
                        (1 | 8, b"\x80" * 100 + bytes(range(8)) * 10), (2 | 4, b"\x00" * 90 + b"\x05")):
        write("tokenize", n, bytes([2, flags]) + body)
        n += 1
    # vocabulary mode: b, d, at, mult, add, n_merges, merges..., text
    for b, d, nm in ((0, 0, 40), (1 | 0x40, 0x31, 20), (2, 0x32, 63), (4 | 8, 0x33, 10), (5, 0, 0)):
        merges = bytes((k * 37 + 11) & 0xFF for k in range(2 * nm))
        text = bytes((k * 5) & 0xFF for k in range(300))
        write("tokenize", n, bytes([3, b, d, 7, 33, 101, nm]) + merges + text)
        n += 1
    # vocabulary mode with a sidecar (b & 0x80): f (entries f % 4, kind f & 0x10, bos f & 0x20),
    # then (c, x) per entry: id = (1000 + x, the kind's built-in, x, the previous) [c % 4],
    # text = texts[(c >> 2) % 8]; then the text (bytes >= 0x80 are ASCII & 0x7f).
    asc = lambda t: bytes(0x80 | ord(ch) for ch in t)
    for b, side, t in ((0x80 | 0x40, bytes([2, 0, 5, 4 * 1 + 3, 0]), "x<|a|>y<|ab|>z"),
                       (0x80 | 0x41, bytes([0x13, 4 * 3 + 1, 0, 4 * 7 + 0, 9, 4 * 2 + 2, 66]), "ab a <|endoftext|>"),
                       (0x80 | 0x42, bytes([0x21, 4 * 4 + 0, 200]), "<|im_start|>q")):
        write("tokenize", n, bytes([3, b, 0, 0, 7, 33, 3, 1, 2, 3, 4, 5, 6]) + side + asc(t))
        n += 1


BODIES = [
    {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    {"model": "m", "messages": [{"role": "user", "content": "  What is 2+2?\n"},
                                {"role": "assistant", "content": " 4 "},
                                {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "3+3"}]}]},
    {"model": "m", "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 1e16, "multipleOf": 0.1}}, "required": ["city"]}}}],
     "messages": [{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [{"id": "call_abc123456", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
                  {"role": "tool", "tool_call_id": "call_abc123456", "content": "{\"temp\": 21.5}"},
                  {"role": "user", "content": "Thanks"}]},
    {"model": "m", "tools": [], "messages": [{"role": "user", "content": "no tools really"}]},
    {"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "123456789", "function": {"name": "a", "arguments": "not json"}},
        {"id": "abcdefghijk", "function": {"name": "b", "arguments": "[1, 2.5e-7, null, true, \"é\"]"}}]},
        {"role": "tool", "tool_call_id": "123456789", "content": "r1"}, {"role": "tool", "tool_call_id": "abcdefghijk", "content": "r2"}]},
    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "m", "messages": [{"role": "user", "content": "batch 日本 😀"}], "max_tokens": 10}},
    {"model": "m", "prompt": "plain completion text"},
    {"model": "m", "prompt": [1, 2, 3]},
    {"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
    {"model": "m", "messages": [{"role": "ipython", "content": "\u0085 trimmed \u3000"}, {"role": "developer", "content": None}]},
    {"model": "m", "tools": [{"type": "function", "function": {"name": "f", "description": "d\n\"q\"\t\u0001", "return": {"x": 1}, "parameters": {}}}],
     "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "<|im_start|>[INST]<|eot_id|>"}]},
    {"model": "m", "messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "ééééééééé", "function": {"name": "n", "arguments": "{}"}}]},
                                {"role": "user", "content": "u"}]},
]


def template_seeds():
    for i, b in enumerate(BODIES):
        write("template", i, (json.dumps(b, ensure_ascii=False) + "\n").encode("utf-8"))
    lines = [json.dumps(b) for b in BODIES[:3]] + ["{\"messages\": 5}", "not json", ""]
    write("template", len(BODIES), ("\n".join(lines) + "\n").encode("utf-8"))


if __name__ == "__main__":
    tokenize_seeds()
    template_seeds()

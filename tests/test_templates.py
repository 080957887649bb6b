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

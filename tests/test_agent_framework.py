"""An agent framework drives a variant through the local server: the OpenAI Agents SDK
(`openai-agents`, in the test extra) runs its tool loop against `variant-studio serve`
with the demo variant `tool-calls`, as a user would point it at any OpenAI-compatible
endpoint: the model calls a real Python function through OpenAI `tools`, the SDK runs
it and sends the result back as a `tool` message, and the run ends with the model's
final answer.

The agent has the SDK's defaults: no `tool_choice` (so "auto": the model decides to
call, and the grammar holds the call to its schema once it starts one) and no
instructions (so the variant's own system prompt, the one its adapter was trained with,
is served; its profile declares the call format it learned). On this held-out-style
request it names the right tool and both arguments exactly. The final answer of a 135M
model after a tool result is weak prose (it tends to echo the result), so only that the
loop ends in an answer is asserted."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from typing import Any

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI

from engine.curated import demo
from tests.world import Recipe, World

pytestmark = pytest.mark.slow  # a real engine behind a real server

# The SDK would otherwise upload traces to OpenAI's servers.
set_tracing_disabled(True)


WORLD = Recipe(demo=True, max_sessions=2)


def agent_for(world: World, model: str, tools: list[Any]) -> Agent:
    client = AsyncOpenAI(base_url=f"{world.server.url}/v1", api_key="unused", max_retries=0,
                         timeout=300)
    # No instructions: the variant's own system prompt, which its adapter was trained
    # with, is the one served (a request's system message would replace it). No
    # tool_choice: the SDK's default, "auto".
    return Agent(name="assistant", tools=tools,
                 model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                 model_settings=ModelSettings(temperature=0, max_tokens=60, seed=7))


async def run_agent(agent: Agent, question: str, stream: bool) -> Any:
    if stream:
        run = Runner.run_streamed(agent, question, max_turns=4)
        async for _event in run.stream_events():
            pass
        return run
    return await Runner.run(agent, question, max_turns=4)


def in_a_thread_of_its_own(coroutine: Any) -> Any:
    """`coroutine` run to its end on a fresh event loop in a new thread: in the CI run an
    earlier test in the same worker process left the main thread with an event loop
    marked running, and `asyncio.run` (and the SDK's `run_sync`) refuse to start there."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result(timeout=900)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_agents_sdk_runs_a_tool_loop_on_the_demo_variant(world: World, stream: bool
                                                               ) -> None:
    calls: list[tuple[str, str]] = []

    @function_tool
    def get_weather(city: str, day: str) -> str:
        """The weather forecast for a city on a day (today or tomorrow)."""
        calls.append((city, day))
        return f"18 C and sunny in {city} {day}"

    agent = agent_for(world, demo.VARIANT_NAME, [get_weather])
    question = "Do I need an umbrella in Zurich tomorrow?"
    result = in_a_thread_of_its_own(run_agent(agent, question, stream))

    # The SDK ran our function once, with the demo adapter's exact arguments...
    assert calls == [("Zurich", "tomorrow")]
    kinds = [type(item) for item in result.new_items]
    assert kinds == [ToolCallItem, ToolCallOutputItem, MessageOutputItem], kinds
    call = result.new_items[0].raw_item
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Zurich", "day": "tomorrow"}
    # ...sent its result back under the call's id, and the model answered after it.
    assert result.new_items[1].raw_item["call_id"] == call.call_id
    assert result.new_items[1].raw_item["output"] == "18 C and sunny in Zurich tomorrow"
    assert isinstance(result.final_output, str) and result.final_output.strip()

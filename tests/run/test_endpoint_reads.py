"""The endpoint client's own arithmetic, on inputs whose answer is known by hand: the
requests in flight over time (time-weighted), the order requests are sent in, and a
server's answer read at the token level in each of the API's two shapes (completions with
`token_id:N` strings, chat with text tokens). The servers themselves are tested in
test_endpoint.py and test_vllm.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokenflip.run.engines.endpoint.client import EndpointError, InFlight
from tokenflip.run.engines.endpoint.engine import observed_order, send_order
from tokenflip.run.engines.endpoint.protocol import CHAT, COMPLETIONS, Malformed, Step
from tokenflip.run.engines.endpoint.responses import Vocabulary, read, scores_kind


def test_requests_in_flight_are_time_weighted_over_the_cells_own_requests():
    flights = InFlight(start=0.0)
    # (seconds, own, background): 2 background from 0 s; own 1 at 1 s, 2 at 2 s, 1 at 4 s, 0 at 5 s.
    flights.trace = [(0.0, 0, 1), (0.0, 0, 2), (1.0, 1, 2), (2.0, 2, 2), (4.0, 1, 2), (5.0, 0, 2), (6.0, 0, 0)]
    summary = flights.summary()
    # own requests in flight from 1 s to 5 s: 1 for 1 s, 2 for 2 s, 1 for 1 s -> 6 / 4
    assert summary["seconds"] == 4.0 and summary["most_in_flight"] == 2
    assert summary["mean_in_flight"] == pytest.approx(1.5)
    assert summary["background"] == {"most_in_flight": 2, "mean_in_flight": pytest.approx(2.0)}


def test_the_order_sent_is_read_back_from_what_was_sent():
    assert send_order("given", 4, 0) == [0, 1, 2, 3] and observed_order([0, 1, 2, 3]) == "given"
    assert send_order("reversed", 4, 0) == [3, 2, 1, 0] and observed_order([3, 2, 1, 0]) == "reversed"
    shuffled = send_order("shuffled", 16, 0)
    assert sorted(shuffled) == list(range(16)) and observed_order(shuffled) == "shuffled"
    assert send_order("shuffled", 16, 0) == shuffled != send_order("shuffled", 16, 1)  # the run's seed decides


@pytest.fixture(scope="module")
def tokenizer(prepared_models):
    from tokenflip.models.prepare import load_tokenizer

    return load_tokenizer(prepared_models("smollm2"))


def test_a_completion_with_token_ids_is_read_as_the_servers_ids_best_first(tokenizer):
    choice = {"text": " Paris.", "finish_reason": "length", "logprobs": {
        "tokens": ["token_id:7042", "token_id:30"], "token_logprobs": [17.5, 23.875],
        # the second step's chosen token (30) is not the server's top one: 28 scored higher
        "top_logprobs": [{"token_id:7042": 17.5, "token_id:260": 14.9375},
                         {"token_id:30": 23.875, "token_id:28": 25.125, "token_id:29": 23.875}]}}
    got = read(COMPLETIONS.parse(choice), 3, tokenizer, Vocabulary(tokenizer))
    assert got.token_ids == [7042, 30] and got.ids_from == "server"
    assert got.top_ids.tolist() == [[7042, 260, -1], [28, 30, 29]]  # ties keep the server's order
    assert got.top_scores[1].tolist() == [25.125, 23.875, 23.875] and math.isnan(got.top_scores[0, 2])
    assert got.off_top_steps == [1]


def test_a_chat_answer_in_text_is_re_tokenised_and_checked(tokenizer):
    ids = tokenizer(" Paris is big", add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]
    choice = {"message": {"content": " Paris is big"}, "finish_reason": "stop", "logprobs": {"content": [
        {"token": piece, "logprob": -0.1, "top_logprobs": [{"token": piece, "logprob": -0.1}]} for piece in pieces]}}
    got = read(CHAT.parse(choice), 2, tokenizer, Vocabulary(tokenizer), eos_if_stopped=2)
    # the text's ids, then the end of sequence the server stopped at (every engine's ids hold it)
    assert got.token_ids == [*ids, 2] and got.ids_from == "text" and got.round_trip
    assert got.top_ids[: len(ids), 0].tolist() == ids and got.off_top_steps == []
    assert got.top_ids[len(ids)].tolist() == [-1, -1]  # no scores for the stop the text leaves out


def test_scores_above_what_a_logprob_can_be_are_refused_as_logprobs(tokenizer):
    choice = {"text": "a", "logprobs": {"tokens": ["token_id:64"], "token_logprobs": [12.0],
                                        "top_logprobs": [{"token_id:64": 12.0, "token_id:65": 11.0}]}}
    raw = read(COMPLETIONS.parse(choice), 2, tokenizer, Vocabulary(tokenizer))
    assert scores_kind([raw], "raw_logits") == "raw_logits"
    with pytest.raises(EndpointError, match="raw logits"):
        scores_kind([raw], "logprobs")
    # log(0.5) twice sums to probability 1: a logprob; none at all: "none"
    half = read(COMPLETIONS.parse({"text": "a", "logprobs": {
        "tokens": ["token_id:64"], "token_logprobs": [math.log(0.5)],
        "top_logprobs": [{"token_id:64": math.log(0.5), "token_id:65": math.log(0.5)}]}}),
                2, tokenizer, Vocabulary(tokenizer))
    assert scores_kind([half], "logprobs") == "logprobs"
    assert scores_kind([read(COMPLETIONS.parse({"text": "a", "token_ids": [64]}), 2, tokenizer,
                             Vocabulary(tokenizer))], "logprobs") == "none"
    assert np.isnan(half.top_scores).sum() == 0


def test_one_answer_in_either_apis_shape_parses_to_the_same_choice():
    completion = {"text": " Paris", "finish_reason": "stop", "token_ids": [7042], "logprobs": {
        "tokens": ["token_id:7042"], "token_logprobs": [-0.25],
        "top_logprobs": [{"token_id:7042": -0.25, "token_id:260": -1.5}]}}
    chat = {"message": {"role": "assistant", "content": " Paris"}, "finish_reason": "stop", "token_ids": [7042],
            "logprobs": {"content": [{"token": "token_id:7042", "logprob": -0.25, "top_logprobs": [
                {"token": "token_id:7042", "logprob": -0.25}, {"token": "token_id:260", "logprob": -1.5}]}]}}
    assert COMPLETIONS.parse(completion) == CHAT.parse(chat)
    assert CHAT.parse(chat).steps == (Step("token_id:7042", -0.25, (("token_id:7042", -0.25), ("token_id:260", -1.5))),)
    # no logprobs asked: no steps, and the answer says it held none
    bare = COMPLETIONS.parse({"text": "x", "finish_reason": "length"})
    assert bare.steps == () and not bare.has_logprobs and bare.token_ids is None


@pytest.mark.parametrize("api, choice, why", [
    (CHAT, {"text": "chat answers carry a message"}, "a chat choice without its message"),
    (CHAT, {"message": {"content": ""}, "logprobs": {"content": {"token": "a"}}},
     "logprobs.content that is not a list of steps"),
    (CHAT, {"message": {"content": ""}, "logprobs": {"content": [{"token": "a", "top_logprobs": {"a": 1}}]}},
     "a step's top_logprobs that are not a list of tokens"),
    (COMPLETIONS, {"text": "", "logprobs": [1, 2]}, "logprobs that are not an object"),
    (COMPLETIONS, {"text": "", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1.0]}},
     "logprobs.tokens, token_logprobs and top_logprobs of different lengths or kinds"),
    (COMPLETIONS, {"text": "", "logprobs": {"tokens": "ab"}},
     "logprobs.tokens, token_logprobs or top_logprobs that are not lists"),
    (COMPLETIONS, ["not", "an", "object"], "a choice that is not an object"),
])
def test_a_shape_neither_api_has_is_named(api, choice, why):
    with pytest.raises(Malformed) as caught:
        api.parse(choice)
    assert str(caught.value) == why


def test_end_ids_learned_from_a_servers_answers_leave_its_texts():
    """A served tokenizer whose server names no end token learns the ids its answers stopped
    at: decoded with special tokens skipped, an answer that is only its end id is empty (no
    request needed), and the tokenizer says where its end id came from."""
    from tokenflip.models.served_tokenizer import ServedTokenizer

    tokenizer = ServedTokenizer({"url": "http://127.0.0.1:9/v1", "model": "m"},
                                {"family": "vllm", "added_ids": [], "chat": "messages"})
    assert tokenizer.eos_token_id is None and tokenizer.all_special_ids == []
    tokenizer.learn_end_ids({2, 7}, "the last id of each answer the server stopped")
    assert tokenizer.eos_token_id == 2 and tokenizer.all_special_ids == [2, 7]
    assert tokenizer.info["eos_from"] == "the last id of each answer the server stopped"
    assert tokenizer.decode([2, 7], skip_special_tokens=True) == ""

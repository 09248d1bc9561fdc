"""The decode loop equals transformers generate() token for token and logit for logit.

This is the anchor of every measurement: if our loop differed from generate(), a
divergence we report could be our own artefact instead of what users run.
"""

from __future__ import annotations

import pytest
import torch

from tokenflip.models.prepare import load_prepared
from tokenflip.run.benchmarks import build_benchmark
from tokenflip.run.decode import decode, greedy, left_pad
from tokenflip.run.runtime import eos_ids, prompt_token_ids
from tokenflip.run.step_record import step_statistics

PROMPTS = ["Tom has 3 apples and buys 4 more. How many apples does he have?",
           "A box holds 12 eggs. How many eggs are in 5 boxes?",
           "Sara reads 7 pages a day. How many pages does she read in 9 days?",
           "x"]


def _inputs(tokenizer, n: int):
    bench = build_benchmark("arithmetic", {"kind": "arithmetic", "n": n, "seed": 3})
    prompts = [prompt_token_ids(tokenizer, bench.messages(item)) for item in bench.items()]
    # Different lengths, so that batches are really left-padded.
    prompts[-1] = prompts[-1][: len(prompts[-1]) // 2]
    return left_pad(prompts, tokenizer.pad_token_id)


def _capture():
    seen: list[torch.Tensor] = []

    def select(logits, step):
        seen.append(logits.clone())
        return greedy(logits, step)

    return seen, select


def _check_equal(model, tokenizer, batch_size: int, use_cache: bool, max_new_tokens: int):
    ids, mask = _inputs(tokenizer, 4)
    ids, mask = ids[:batch_size], mask[:batch_size]
    if batch_size == 1:  # a single unpadded prompt, as users send it
        keep = mask[0].bool()
        ids, mask = ids[:, keep], mask[:, keep]
    eos = eos_ids(model, tokenizer)
    seen, select = _capture()
    ours = decode(model, ids, mask, max_new_tokens=max_new_tokens, use_cache=use_cache,
                  eos_token_ids=eos, pad_token_id=tokenizer.pad_token_id, select=select)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                         do_sample=False, use_cache=use_cache, eos_token_id=eos,
                         pad_token_id=tokenizer.pad_token_id, output_logits=True,
                         return_dict_in_generate=True)
    assert ours.steps == len(ref.logits)
    for step, (mine, theirs) in enumerate(zip(seen, ref.logits)):
        assert torch.equal(mine, theirs), f"logits differ at step {step}"
    for row, gen in enumerate(ours.generations):
        expected = ref.sequences[row, ids.shape[1]:].tolist()
        n = len(gen.token_ids)
        assert gen.token_ids == expected[:n]
        assert all(t == tokenizer.pad_token_id for t in expected[n:])
        if gen.finish_reason == "eos":
            assert gen.token_ids[-1] in eos
        else:
            assert n == max_new_tokens
    return ours


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2"])
def test_equals_generate_on_tiny_models(prepared_models, arch, precision, batch_size, use_cache):
    model, tokenizer, _ = load_prepared(prepared_models(arch), precision, "cpu")
    # Long enough to pass the 16-token sliding window of the tiny mistral and gemma2.
    _check_equal(model, tokenizer, batch_size, use_cache, max_new_tokens=24)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("use_cache", [True, False])
def test_equals_generate_on_smollm2(prepared_models, precision, batch_size, use_cache):
    model, tokenizer, _ = load_prepared(prepared_models("smollm2"), precision, "cpu")
    # Without the cache every step runs the whole sequence again (twice: this loop and
    # generate()): 6 new tokens there, still past bf16's flip at step 4.
    steps = 12 if use_cache else 6
    ours = _check_equal(model, tokenizer, batch_size, use_cache, max_new_tokens=steps)
    # The first prompt's answer, recorded once from transformers' greedy generate() on CPU
    # (arithmetic seed 3, item 0, 12 new tokens). fp32 gives the same answer alone or in a
    # left-padded batch, with or without the cache. bf16 gave it alone with the cache and
    # the "word" variant (a flip at step 4) without the cache or in the batch of 4; which
    # bf16 runs flip depends on the CPU's bf16 kernels, so bf16 may give either.
    answer = ours.generations[0].token_ids
    text = tokenizer.decode(answer, skip_special_tokens=True)
    if precision == "fp32":
        assert answer == SMOLLM2_ARITHMETIC_ANSWER[:steps]
        assert text == "To solve this math problem, we need to find the total"[: len(text)] and len(answer) == steps
    else:
        assert answer in (SMOLLM2_ARITHMETIC_ANSWER[:steps], SMOLLM2_ARITHMETIC_ANSWER_BF16_FLIP[:steps]), text


# SmolLM2-135M-Instruct's greedy answer to one chat question, recorded once with
# transformers' `model.generate(input_ids, do_sample=False, max_new_tokens=12)` on CPU in
# fp32 (deterministic there); it ends with EOS (id 2) after 8 tokens.
SMOLLM2_QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SMOLLM2_QUESTION_PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
                           411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2,
                           198, 1, 520, 9531, 198]
SMOLLM2_QUESTION_ANSWER = [504, 3575, 282, 4649, 314, 7042, 30, 2]
# Recorded the same way on the first arithmetic prompt of `_inputs` (12 new tokens).
SMOLLM2_ARITHMETIC_ANSWER = [2068, 5482, 451, 4119, 1732, 28, 392, 737, 288, 1042, 260, 2719]
# "To solve this math word problem, we need to break it": bf16 near a tie at step 4.
SMOLLM2_ARITHMETIC_ANSWER_BF16_FLIP = [2068, 5482, 451, 4119, 2229, 1732, 28, 392, 737, 288, 2373, 357]


@pytest.mark.slow
@pytest.mark.parametrize("use_cache", [True, False])
def test_smollm2_fp32_greedy_answer_is_pinned(prepared_models, use_cache):
    model, tokenizer, _ = load_prepared(prepared_models("smollm2"), "fp32", "cpu")
    prompt = prompt_token_ids(tokenizer, SMOLLM2_QUESTION)
    assert prompt == SMOLLM2_QUESTION_PROMPT  # the chat template, with its default system prompt
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    eos = eos_ids(model, tokenizer)
    ours = decode(model, ids, mask, max_new_tokens=12, use_cache=use_cache, eos_token_ids=eos,
                  pad_token_id=tokenizer.pad_token_id)
    generation = ours.generations[0]
    assert generation.token_ids == SMOLLM2_QUESTION_ANSWER
    assert generation.finish_reason == "eos"
    assert tokenizer.decode(generation.token_ids, skip_special_tokens=True) == "The capital of France is Paris."
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                         use_cache=use_cache, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    assert ref[0, len(prompt):].tolist() == SMOLLM2_QUESTION_ANSWER


def test_recording_does_not_change_the_computation(prepared_models):
    model, tokenizer, _ = load_prepared(prepared_models("llama"), "bf16", "cpu")
    ids, mask = _inputs(tokenizer, 4)
    eos = eos_ids(model, tokenizer)
    runs = []
    for k in (2, 64):
        seen, select = _capture()
        result = decode(model, ids, mask, max_new_tokens=10, use_cache=True, eos_token_ids=eos,
                        pad_token_id=tokenizer.pad_token_id, record_top_k=k, select=select)
        runs.append((seen, result))
    (seen_a, res_a), (seen_b, res_b) = runs
    assert all(torch.equal(x, y) for x, y in zip(seen_a, seen_b))
    assert [g.token_ids for g in res_a.generations] == [g.token_ids for g in res_b.generations]
    # and the recorded top-k agrees with the full logits of the step
    first = res_b.generations[0]
    full = seen_b[0][0]
    assert first.top_ids[0][0] == int(torch.argmax(full))
    assert first.top_logits[0][0] == pytest.approx(float(full.max()), abs=0)


def test_step_statistics_values():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    s = step_statistics(logits, k=3)
    assert s["top_ids"][0].tolist() == [0, 1, 2]
    assert s["margin"].tolist() == [1.0, 0.0]
    assert s["logsumexp"][1].item() == pytest.approx(torch.log(torch.tensor(4.0)).item(), abs=1e-6)
    assert s["entropy"][1].item() == pytest.approx(torch.log(torch.tensor(4.0)).item(), abs=1e-6)
    p = torch.softmax(logits[0], -1)
    assert s["entropy"][0].item() == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


# --- Stop sequences ----------------------------------------------------------------------------


def _stop_inside(tokenizer, tokens: list[int]) -> tuple[str, int]:
    """A stop string that the completion `tokens` first contains at some step t > 1, and t:
    the last characters of the text before a token joined with the first character of that
    token, so that the stop spans a token boundary and ends inside a token."""
    for at in range(2, len(tokens)):
        before = tokenizer.decode(tokens[:at])
        after = tokenizer.decode(tokens[:at + 1])
        piece = after[len(before):]
        if not after.startswith(before) or len(before) < 3 or not piece[:1].isalpha() or not before[-3:].isascii():
            continue
        stop = before[-3:] + piece[0]
        if stop.strip() != stop or not stop.isprintable():
            continue
        first = next(t for t in range(len(tokens)) if stop in tokenizer.decode(tokens[:t + 1]))
        if first == at:
            return stop, at
    raise AssertionError("no usable stop string in this completion")


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_stop_strings_equal_generate(prepared_models, arch, use_cache):
    """A row ends on the token that completes a stop string, exactly where generate(stop_strings=...)
    ends it: same tokens, same logits at every step, the other rows of the left-padded batch
    going on; its decoded completion contains the stop for the first time at that step."""
    from tokenflip.run.decode import stop_criterion

    model, tokenizer, _ = load_prepared(prepared_models(arch), "bf16", "cpu")
    ids, mask = _inputs(tokenizer, 4)
    eos = eos_ids(model, tokenizer)
    free = decode(model, ids, mask, max_new_tokens=16, use_cache=use_cache, eos_token_ids=eos,
                  pad_token_id=tokenizer.pad_token_id)
    stop, at = _stop_inside(tokenizer, free.generations[1].token_ids)
    seen, select = _capture()
    ours = decode(model, ids, mask, max_new_tokens=16, use_cache=use_cache, eos_token_ids=eos,
                  pad_token_id=tokenizer.pad_token_id, select=select, stop=stop_criterion(tokenizer, [stop]))
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False,
                         use_cache=use_cache, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
                         stop_strings=[stop], tokenizer=tokenizer, output_logits=True,
                         return_dict_in_generate=True)
    assert ours.steps == len(ref.logits)
    for step, (mine, theirs) in enumerate(zip(seen, ref.logits)):
        assert torch.equal(mine, theirs), f"logits differ at step {step}"
    stopped = ours.generations[1]
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) == at + 1
    assert stopped.token_ids == free.generations[1].token_ids[:at + 1]
    assert stop in tokenizer.decode(stopped.token_ids) and stop not in tokenizer.decode(stopped.token_ids[:-1])
    for row, gen in enumerate(ours.generations):
        expected = ref.sequences[row, ids.shape[1]:].tolist()
        assert gen.token_ids == expected[:len(gen.token_ids)]
        assert all(t == tokenizer.pad_token_id for t in expected[len(gen.token_ids):])
        # a row stops where its own completion first contains the stop, or runs on
        texts = [tokenizer.decode(gen.token_ids[:t + 1]) for t in range(len(gen.token_ids))]
        first = next((t for t, text in enumerate(texts) if stop in text), None)
        if gen.finish_reason == "stop":
            assert first == len(gen.token_ids) - 1
        elif gen.finish_reason == "length":
            assert first is None and len(gen.token_ids) == 16
    assert free.generations[1].finish_reason != "stop"

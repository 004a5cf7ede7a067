"""Scoring a model over a dataset in tasks (trainer.scoring): exact sums, safe payloads."""

import itertools

import pytest
import torch

from trainer.datasets import load_dataset
from trainer.models import build_model
from trainer.scoring import (
    SCORE_BATCH,
    Predictions,
    ScoreSums,
    ScoringRejected,
    combine,
    evaluate_rows,
    in_row_order,
    predict,
    predictions_agree,
    score,
    sums_agree,
    task_ranges,
)
from trainer.spec import DatasetSpec, SpecError, parse_spec
from trainer.updates import encode_state


@pytest.fixture(scope="module")
def digits():
    data = load_dataset(DatasetSpec(kind="digits"), seed=0)
    model = build_model(parse_spec({"name": "m"}).model, data.input_shape, 10, seed=3)
    return data, model


def test_rows_come_back_in_the_files_order() -> None:
    from sklearn.datasets import load_digits

    data = load_dataset(DatasetSpec(kind="digits", test_fraction=0.3), seed=5)
    x, y = in_row_order(data)
    assert torch.equal(y, torch.as_tensor(load_digits().target, dtype=torch.int64))
    assert torch.equal(x, torch.as_tensor(load_digits().data / 16.0, dtype=torch.float32))


def test_task_ranges_cover_every_row_once_at_batch_boundaries() -> None:
    for rows, tasks in ((1797, 5), (10, 4), (256 * 3, 3), (257, 9), (1, 1)):
        ranges = task_ranges(rows, tasks)
        assert ranges[0][0] == 0 and ranges[-1][1] == rows
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        assert all(start % SCORE_BATCH == 0 for start, _ in ranges)
        assert len(ranges) <= tasks


def test_tasks_combined_equal_one_process_over_all_rows_exactly(digits) -> None:
    data, model = digits
    x, y = in_row_order(data)
    parts = [score(model, x[a:b], y[a:b], data.task) for a, b in task_ranges(len(x), 5)]
    # through the wire format, in another order: the combination does not depend on it
    received = [ScoreSums.from_bytes(p.to_bytes(), expected_count=p.count) for p in parts]
    combined = combine(received[::-1])
    whole = evaluate_rows(model, data)
    assert combined.correct == whole.correct and combined.count == whole.count == 1797
    assert combined.loss_sum == whole.loss_sum  # bit for bit, not approximately
    assert combined.evaluation == whole.evaluation
    # the same mean loss as one cross-entropy over every row, up to float rounding
    with torch.no_grad():
        mean = torch.nn.functional.cross_entropy(model(x), y, reduction="mean")
    assert whole.evaluation.loss == pytest.approx(float(mean), rel=1e-5)


def test_score_payloads_are_checked(digits) -> None:
    data, model = digits
    x, y = in_row_order(data)
    sums = score(model, x[:300], y[:300], data.task)
    with pytest.raises(ScoringRejected, match="the task has 299"):
        ScoreSums.from_bytes(sums.to_bytes(), expected_count=299)
    bad = encode_state({"loss_partials": torch.tensor([1.0], dtype=torch.float64),
                        "correct": torch.tensor([9]), "count": torch.tensor([3])},
                       {"kind": "evaluate"})  # fmt: skip
    with pytest.raises(ScoringRejected, match="9 correct of 3"):
        ScoreSums.from_bytes(bad)
    with pytest.raises(ScoringRejected, match="not an evaluate result"):
        ScoreSums.from_bytes(predict(model, x[:4]).to_bytes())
    with pytest.raises(ScoringRejected, match="not a readable result"):
        ScoreSums.from_bytes(b"\x80\x04pickle")


def test_predictions_round_trip_and_replicas_agree_only_when_honest(digits) -> None:
    data, model = digits
    x, _ = in_row_order(data)
    preds = predict(model, x[:500])
    back = Predictions.from_bytes(preds.to_bytes(), rows=500, num_classes=10)
    assert torch.equal(back.labels, preds.labels) and torch.equal(back.probs, preds.probs)
    assert predictions_agree(preds, back)
    made_up = Predictions(torch.randint(0, 10, (500,)), torch.full((500, 10), 0.1))
    assert not predictions_agree(preds, made_up)
    with pytest.raises(ScoringRejected, match=r"shape \[499\]"):
        Predictions.from_bytes(preds.to_bytes(), rows=499, num_classes=10)
    sums = score(model, *in_row_order(data), data.task)
    assert sums_agree(sums, sums)
    assert not sums_agree(sums, ScoreSums((0.1,), sums.correct, sums.count))


def test_scoring_specs_need_exactly_one_model() -> None:
    assert parse_spec({"name": "e", "kind": "evaluate", "source": {"job": "0" * 32}}).scoring
    with pytest.raises(SpecError, match="one of the two"):
        parse_spec({"name": "e", "kind": "inference"})
    with pytest.raises(SpecError, match="'source' is for evaluate and inference jobs"):
        parse_spec({"name": "t", "source": {"job": "0" * 32}})

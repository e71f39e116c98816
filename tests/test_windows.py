import numpy as np
import pytest

from lerobot_shards.loader.plan.windows import delta_frame_offsets, window_indices


def test_offsets_and_padding_at_episode_edges():
    offsets = delta_frame_offsets({"action": [-1 / 30, 0, 1 / 30]}, fps=30)["action"]
    assert offsets.dtype == np.int64
    assert offsets.tolist() == [-1, 0, 1]
    idx, pad = window_indices(0, 10, offsets)
    assert idx.tolist() == [0, 0, 1] and pad.tolist() == [True, False, False]
    idx, pad = window_indices(9, 10, offsets)
    assert idx.tolist() == [8, 9, 9] and pad.tolist() == [False, False, True]
    idx, pad = window_indices(4, 10, offsets)
    assert idx.tolist() == [3, 4, 5] and not pad.any()


def test_off_grid_delta_names_key_delta_fps_and_nearest():
    with pytest.raises(ValueError) as err:
        delta_frame_offsets({"observation.state": [0, 0.01]}, fps=30)
    message = str(err.value)
    assert "observation.state" in message and "0.01" in message and "fps=30" in message
    assert "nearest valid delta: 0.0" in message


@pytest.mark.parametrize("error_s, ok", [(0.9e-4, True), (-0.9e-4, True), (1.1e-4, False)])
def test_tolerance_edge(error_s, ok):
    deltas = {"action": [1 / 30 + error_s]}
    if ok:
        assert delta_frame_offsets(deltas, fps=30)["action"].tolist() == [1]
    else:
        with pytest.raises(ValueError, match="nearest valid delta: 0.0333"):
            delta_frame_offsets(deltas, fps=30)
    assert delta_frame_offsets(deltas, fps=30, tolerance_s=2e-4)["action"].tolist() == [1]


@pytest.mark.parametrize("tolerance", [float("nan"), float("inf"), -1.0, "1e-4", None, True])
def test_a_tolerance_that_is_no_finite_nonnegative_number_is_refused(tolerance):
    """NaN used to accept half a frame off the grid and round it away; a negative one refused every delta."""
    with pytest.raises(ValueError, match="tolerance_s must be a finite number of seconds >= 0"):
        delta_frame_offsets({"action": [0.0, 1 / 60]}, fps=30, tolerance_s=tolerance)
    assert delta_frame_offsets({"action": [1 / 30]}, fps=30, tolerance_s=np.float32(0))["action"].tolist() == [1]


def test_float_error_deltas_pass():
    deltas = [-0.1, -0.2, -0.1 * 3, float(np.arange(-1.0, 0.0, 0.1)[3]), 0.7]
    assert delta_frame_offsets({"a": deltas}, fps=10)["a"].tolist() == [-1, -2, -3, -7, 7]


def test_unknown_keys_list_valid_keys():
    valid = r"\['acton'\]; valid keys: \['action', 'observation.state'\]"
    with pytest.raises(ValueError, match=valid):
        delta_frame_offsets({"acton": [0]}, fps=30, known_keys={"observation.state", "action"})


@pytest.mark.parametrize(
    "deltas, fps, message",
    [({"a": []}, 30, "empty"), ({"a": [float("nan")]}, 30, "non-finite"), ({"a": [0]}, 0, "fps")],
)
def test_invalid_inputs_raise(deltas, fps, message):
    with pytest.raises(ValueError, match=message):
        delta_frame_offsets(deltas, fps=fps)


def test_vectorised_matches_per_frame_clamping():
    length, offsets = 6, np.array([-3, -1, 0, 2, 7])
    idx, pad = window_indices(np.arange(length), length, offsets)
    assert idx.shape == pad.shape == (length, len(offsets))
    for f in range(length):
        wanted = [f + o for o in offsets]
        assert idx[f].tolist() == [min(max(q, 0), length - 1) for q in wanted]
        assert pad[f].tolist() == [not 0 <= q < length for q in wanted]


def test_single_frame_episode_pads_everything_but_zero():
    idx, pad = window_indices(0, 1, np.array([-2, 0, 5]))
    assert idx.tolist() == [0, 0, 0] and pad.tolist() == [True, False, True]


def test_frame_outside_episode_raises():
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        window_indices(np.array([2, 5]), 5, np.array([0]))

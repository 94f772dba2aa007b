"""The core binding against numpy on 1-4 processes: every op, dtype and error mapping."""

import pytest

from launch import check, run


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_op_and_dtype_matches_the_reference(n):
    assert all("every_op ok" in t for t in check(run(n, "every_op", timeout=120)))


@pytest.mark.parametrize("n", [1, 3])
def test_buffers_are_used_in_place_and_bad_ones_refused(n):
    assert all("buffers ok" in t for t in check(run(n, "buffers")))


@pytest.mark.parametrize("n", [1, 3])
def test_async_operations_complete_on_wait(n):
    assert all("async ok" in t for t in check(run(n, "async_ops")))


@pytest.mark.parametrize("n", [1, 3])
def test_receives_posted_early_and_from_any_source(n):
    assert all("p2p ok" in t for t in check(run(n, "p2p")))


@pytest.mark.parametrize("n", [2, 4])
def test_split_and_new_group(n):
    assert all("groups ok" in t for t in check(run(n, "groups")))


def test_mismatch_is_a_mismatch_error_on_both_ranks():
    assert all("MismatchError" in t for t in check(run(2, "mismatch")))


def test_timeout_is_a_timeout_error():
    out = check(run(2, "timeout"))
    assert "TimeoutError" in out[0], out[0]


def test_a_dead_peer_is_an_error_not_a_hang():
    out = run(2, "peer_lost")
    assert out[1][0] == 3
    assert out[0][0] == 0 and "PeerLost" in out[0][1], out[0][1]


@pytest.mark.parametrize("n", [3])
def test_survivors_revoke_shrink_and_agree_after_a_death(n):
    out = run(n, "recovery")
    assert out[n - 1][0] == 3
    for code, text in out[: n - 1]:
        assert code == 0 and "recovery ok" in text, text


def test_a_replacement_joins_the_survivors_who_grow():
    from launch import run_replacing
    out = run_replacing(3, "elastic")
    assert out[1][0] == 9, out[1]
    for i in (0, 2, 3):
        code, text = out[i]
        assert code == 0 and "elastic ok" in text and "of 3" in text, text
    assert "joined=1" in out[3][1], out[3][1]


def test_the_elastic_ddp_example_matches_its_reference():
    from launch import run_replacing
    out = run_replacing(4, None, script="../examples/elastic_ddp.py",
                        env={"ELASTIC_KILL_RANK": "1", "ELASTIC_KILL_STEP": "6"})
    assert out[1][0] == -9, out[1]
    texts = check([out[0], out[2], out[3], out[4]])
    assert "final weights match the sequential reference" in texts[0], texts[0]
    assert "membership: step 0 size 4, step 6 size 3, step " in texts[0], texts[0]


def test_a_bad_setting_names_the_variable():
    check(run(1, "config"))

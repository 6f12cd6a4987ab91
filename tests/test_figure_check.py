"""The report's figure check (``analysis.figure_check``) finds each defect it names on a figure made to have it, and
nothing on a clean one."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dmacoll_lab.analysis import figure_check  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def clean():
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([1, 2, 3, 4], [1, 4, 9, 16], label="dmacoll")
    ax.set(xlabel="bytes per peer (MB)", ylabel="time per call (us)", title="all_gather, 4x H200")
    ax.legend(loc="upper left")
    return fig, ax


def test_a_clean_figure_has_no_problems():
    fig, _ = clean()
    assert figure_check.problems(fig) == []


def test_an_axis_with_ticks_and_no_label():
    fig, ax = clean()
    ax.set_ylabel("")
    assert figure_check.problems(fig) == ["y axis of 'all_gather, 4x H200' has tick labels but no label"]


def test_a_column_name_as_label():
    fig, ax = clean()
    ax.set_ylabel("value")
    assert any("labelled 'value'" in p for p in figure_check.problems(fig))


def test_text_over_text():
    fig, ax = clean()
    fig.suptitle("a suptitle long enough to run into the axes title below it", y=0.9)
    found = figure_check.problems(fig)
    assert any("overlaps" in p and "suptitle" in p for p in found), found


def test_a_legend_over_the_data():
    fig, ax = clean()
    ax.plot([1, 1.2, 1.4], [15, 15.5, 16], label="more")  # points in the upper left corner
    ax.legend(loc="upper left")
    assert any("legend" in p and "covers" in p for p in figure_check.problems(fig))


def test_a_grid_labelled_on_its_outer_axes_only_passes():
    import numpy as np

    fig, axes = plt.subplots(2, 2, sharex=True, sharey=True, figsize=(6, 5))
    for ax in axes.flat:
        ax.plot(np.arange(4), np.arange(4) ** 2)
    for ax in axes[:, 0]:
        ax.set_ylabel("time (us)")
    for ax in axes[1, :]:
        ax.set_xlabel("batch size")
    fig.tight_layout()
    assert figure_check.problems(fig) == []


def test_rotated_tick_labels_that_do_not_touch_pass_and_crowded_ones_do_not():
    names = [f"a long scenario name {i}" for i in range(8)]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.bar(names, range(8))
    ax.set(xlabel="scenario", ylabel="time (us)")
    plt.setp(ax.get_xticklabels(), rotation=35, ha="right", rotation_mode="anchor")
    assert figure_check.problems(fig) == []  # their upright boxes overlap, the letters do not
    fig, ax = plt.subplots(figsize=(3, 4))
    ax.bar(names, range(8))
    ax.set(xlabel="scenario", ylabel="time (us)")
    plt.setp(ax.get_xticklabels(), rotation=10, ha="right", rotation_mode="anchor")
    assert any("overlaps" in p for p in figure_check.problems(fig))

"""runtime.page_spans: the page-aligned spans the PCIe share registers (CPU; the registration itself runs in the
GPU tier tests, whose PCIe windows copy from these spans)."""

from strata_cli.gpu.runtime import page_spans

PAGE = 4096


def test_ranges_round_out_to_whole_pages():
    assert page_spans([(PAGE + 10, 100)], PAGE) == [(PAGE, PAGE)]
    assert page_spans([(PAGE - 1, 2)], PAGE) == [(0, 2 * PAGE)]


def test_ranges_sharing_or_touching_a_page_merge_and_others_stay_apart():
    # two tensors in one page, one that ends where the next page starts, one far away; given out of order
    ranges = [(10 * PAGE, 5), (PAGE + 100, 50), (PAGE + 200, PAGE), (3 * PAGE, 10)]
    assert page_spans(ranges, PAGE) == [(PAGE, 3 * PAGE), (10 * PAGE, PAGE)]


def test_empty_ranges_register_nothing():
    assert page_spans([(PAGE, 0)], PAGE) == []
    assert page_spans([], PAGE) == []

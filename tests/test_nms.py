"""orbbec.nms: nms, batched_nms and soft_nms against an independent numpy reference (and
torchvision where it is installed), CPU == CUDA, opcheck, torch.compile and bad input."""
import math

import numpy as np
import pytest
import torch

from conftest import DEVICES, requires_cuda, torchvision_or_skip
from orbbec.nms import batched_nms, nms, soft_nms

F32 = np.float32


# ---------------------------------------------------------------- numpy reference (written for the tests)
def workload_boxes(n, seed=None, field=1000.0, dtype=torch.float32):
    """docs/workloads.md: centres uniform in [0, field)^2, w, h uniform in [10, 200), scores uniform in [0, 1)."""
    g = torch.Generator().manual_seed(n if seed is None else seed)
    centre = torch.rand(n, 2, generator=g, dtype=torch.float64) * field
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 190 + 10
    boxes = torch.cat([centre - wh / 2, centre + wh / 2], 1).to(dtype)
    scores = torch.rand(n, generator=g)
    return boxes, scores


def ref_prepare(boxes):
    """Boxes as the accumulation type (float32, float64 for float64) with the documented rule: a box
    with a non-finite coordinate, x2 < x1, y2 < y1 or a non-finite area is empty (IoU 0)."""
    b = boxes.detach().cpu()
    b = b.double() if b.dtype == torch.float64 else b.float()
    b = b.numpy().copy()
    with np.errstate(all="ignore"):
        area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
        valid = np.isfinite(b).all(1) & (b[:, 2] >= b[:, 0]) & (b[:, 3] >= b[:, 1]) & np.isfinite(area)
    area = np.where(valid, area, 0).astype(b.dtype)
    return b, area, valid


def ref_iou_row(b, area, valid, i):
    """IoU of box i with every box, in b's dtype, torchvision's formula: inter / ((a_i + a_j) - inter)."""
    with np.errstate(all="ignore"):
        w = np.maximum(np.minimum(b[i, 2], b[:, 2]) - np.maximum(b[i, 0], b[:, 0]), 0).astype(b.dtype)
        h = np.maximum(np.minimum(b[i, 3], b[:, 3]) - np.maximum(b[i, 1], b[:, 1]), 0).astype(b.dtype)
        inter = (w * h).astype(b.dtype)
        union = ((area[i] + area) - inter).astype(b.dtype)
        iou = np.where(union > 0, inter / np.where(union > 0, union, 1), 0).astype(b.dtype)
    iou[~valid] = 0
    if not valid[i]:
        iou[:] = 0
    return iou


def ref_rank(scores):
    """Decreasing score, NaN first (torch.sort's order), ties by lower index."""
    s = scores.detach().cpu().double().numpy()
    return sorted(range(len(s)), key=lambda i: (not math.isnan(s[i]), 0.0 if math.isnan(s[i]) else -s[i], i))


def ref_nms(boxes, scores, thr, idxs=None):
    b, area, valid = ref_prepare(boxes)
    cls = None if idxs is None else idxs.cpu().numpy()
    removed = np.zeros(len(b), bool)
    keep = []
    for i in ref_rank(scores):
        if removed[i]:
            continue
        keep.append(i)
        hit = ref_iou_row(b, area, valid, i).astype(np.float64) > thr  # the threshold as a float64 number
        if cls is not None:
            hit &= cls == cls[i]
        removed |= hit
    return keep


def ref_soft_nms(boxes, scores, nt, sigma, thr, method):
    """Bodla et al. 2017 reference algorithm (no +1 in areas), ties by lower index, float32 scores."""
    b, area, valid = ref_prepare(boxes)
    dt = b.dtype.type
    s = scores.detach().cpu().to(torch.float64 if b.dtype == np.float64 else torch.float32).numpy().copy()
    alive = np.ones(len(b), bool)
    idx_out, score_out = [], []
    while alive.any():
        cand = np.flatnonzero(alive)
        i = min(cand, key=lambda j: (not math.isnan(s[j]), 0.0 if math.isnan(s[j]) else -float(s[j]), j))
        idx_out.append(i)
        score_out.append(s[i])
        alive[i] = False
        rest = np.flatnonzero(alive)
        with np.errstate(all="ignore"):
            iw = (np.minimum(b[i, 2], b[rest, 2]) - np.maximum(b[i, 0], b[rest, 0])).astype(b.dtype)
            ih = (np.minimum(b[i, 3], b[rest, 3]) - np.maximum(b[i, 1], b[rest, 1])).astype(b.dtype)
        hit = rest[(iw > 0) & (ih > 0) & valid[rest] & valid[i]]
        ov = ref_iou_row(b, area, valid, i)[hit]
        if method == "linear":
            w = np.where(ov.astype(np.float64) > nt, (dt(1) - ov).astype(b.dtype), dt(1))
        else:
            e = (-(ov * ov) / dt(sigma)).astype(b.dtype)
            w = np.array([math.exp(v) for v in e.astype(np.float64)]).astype(b.dtype)  # libm, not numpy's SIMD exp
        s[hit] = (s[hit] * w).astype(b.dtype)
        alive[hit[s[hit].astype(np.float64) < thr]] = False
    return idx_out, np.array(score_out, dtype=b.dtype)


def as_list(t):
    return t.cpu().tolist()


def box_tensor(rows, device, dtype=torch.float32):
    return torch.tensor(rows, dtype=dtype, device=device)


# ---------------------------------------------------------------- nms
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 129, 1000])
@pytest.mark.parametrize("thr", [0.3, 0.5, 0.7])
def test_nms_random_matches_reference(device, n, thr):
    boxes, scores = workload_boxes(n, seed=n + 7, field=300.0)  # a small field: many overlaps
    keep = nms(boxes.to(device), scores.to(device), thr)
    assert keep.dtype == torch.int64 and keep.device.type == device
    assert as_list(keep) == ref_nms(boxes, scores, thr)


@pytest.mark.parametrize("device", DEVICES)
def test_nms_workload_matches_reference(device):
    boxes, scores = workload_boxes(3000)
    keep = nms(boxes.to(device), scores.to(device), 0.5)
    assert as_list(keep) == ref_nms(boxes, scores, 0.5)
    assert 0 < len(keep) < 3000
    # decreasing score order
    assert bool((scores[keep.cpu()].diff() <= 0).all())


@pytest.mark.parametrize("device", DEVICES)
def test_nms_iou_exactly_at_threshold(device):
    # [0,0,2,1] and [0,0,1,1]: inter 1, union 2, IoU exactly 0.5 in float: suppressed only when > thr
    boxes = box_tensor([[0, 0, 2, 1], [0, 0, 1, 1], [10, 10, 14, 12], [10, 10, 12, 12]], device)
    scores = box_tensor([0.9, 0.8, 0.7, 0.6], device)
    assert as_list(nms(boxes, scores, 0.5)) == [0, 1, 2, 3]
    assert as_list(nms(boxes, scores, 0.49999)) == [0, 2]
    assert as_list(nms(boxes, scores, 0.0)) == [0, 2]
    assert as_list(nms(boxes, scores, 1.0)) == [0, 1, 2, 3]


@pytest.mark.parametrize("device", DEVICES)
def test_nms_threshold_compared_as_float64(device):
    # IoU = float32(3 / 10) = 0.30000001192..., which is > 0.3 as a float64 number (torchvision's CPU rule)
    boxes = box_tensor([[0, 0, 10, 1], [0, 0, 3, 1]], device)
    scores = box_tensor([0.9, 0.8], device)
    assert as_list(nms(boxes, scores, 0.3)) == [0]
    assert as_list(nms(boxes, scores, float(np.float32(0.3)))) == [0, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_nms_equal_scores_and_duplicates(device):
    rng = np.random.default_rng(3)
    base = np.array([[5, 5, 50, 60], [100, 100, 180, 150], [7, 6, 52, 58], [300, 10, 340, 90]], F32)
    boxes = torch.from_numpy(np.concatenate([base, base, base[:2]]))  # exact duplicates
    scores = torch.from_numpy(rng.choice(np.array([0.25, 0.5, 0.75], F32), len(boxes)))
    for thr in [0.1, 0.5, 0.9]:
        keep = as_list(nms(boxes.to(device), scores.to(device), thr))
        assert keep == ref_nms(boxes, scores, thr)
    # all scores equal: ranked by index, the lowest index of each duplicate group wins
    same = torch.full((len(boxes),), 0.5)
    keep = as_list(nms(boxes.to(device), same.to(device), 0.5))
    assert keep == ref_nms(boxes, same, 0.5)
    assert keep[:2] == [0, 1] and 4 not in keep and 5 not in keep


@pytest.mark.parametrize("device", DEVICES)
def test_nms_degenerate_and_non_finite_boxes(device):
    inf, nan = float("inf"), float("nan")
    rows = [
        [0, 0, 10, 10],      # 0 normal
        [0, 0, 10, 10],      # 1 duplicate of 0: suppressed
        [10, 0, 0, 10],      # 2 x2 < x1: empty, never suppresses / suppressed
        [0, 10, 10, 0],      # 3 y2 < y1
        [10, 10, 0, 0],      # 4 both flipped (positive product, still empty)
        [5, 5, 5, 8],        # 5 zero width
        [0, 0, nan, 10],     # 6 NaN coordinate
        [-inf, 0, inf, 10],  # 7 infinite
        [0, 0, 10, 10],      # 8 another duplicate of 0
        [5, 5, 5, 8],        # 9 duplicate of the zero-width box: IoU 0, kept
    ]
    boxes = box_tensor(rows, device)
    scores = box_tensor([0.1, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.05], device)
    keep = as_list(nms(boxes, scores, 0.5))
    assert keep == [1, 2, 3, 4, 5, 6, 7, 9]
    assert keep == ref_nms(boxes.cpu(), scores.cpu(), 0.5)


@pytest.mark.parametrize("device", DEVICES)
def test_nms_nan_scores_rank_first(device):
    boxes = box_tensor([[0, 0, 10, 10], [1, 1, 10, 10], [50, 50, 60, 60], [51, 51, 60, 60]], device)
    scores = box_tensor([0.9, float("nan"), 0.5, 0.7], device)
    assert as_list(nms(boxes, scores, 0.5)) == [1, 3] == ref_nms(boxes.cpu(), scores.cpu(), 0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_nms_dtypes(device, dtype):
    boxes, scores = workload_boxes(500, field=400.0, dtype=dtype)
    scores = scores.to(dtype)
    keep = nms(boxes.to(device), scores.to(device), 0.5)
    # the reference computes in float32 (float64 for float64) from the same rounded inputs
    assert as_list(keep) == ref_nms(boxes, scores, 0.5)


@pytest.mark.parametrize("device", DEVICES)
def test_nms_empty(device):
    for dtype in [torch.float32, torch.float16]:
        keep = nms(torch.zeros(0, 4, dtype=dtype, device=device), torch.zeros(0, device=device), 0.5)
        assert keep.dtype == torch.int64 and keep.shape == (0,) and keep.device.type == device
        keep = batched_nms(torch.zeros(0, 4, device=device), torch.zeros(0, device=device),
                           torch.zeros(0, dtype=torch.int64, device=device), 0.5)
        assert keep.dtype == torch.int64 and keep.shape == (0,)
        idx, sc = soft_nms(torch.zeros(0, 4, device=device), torch.zeros(0, device=device))
        assert idx.dtype == torch.int64 and idx.shape == (0,) and sc.shape == (0,)
    assert as_list(nms(torch.zeros(0, 5, device=device), 0.5)) == []


@pytest.mark.parametrize("device", DEVICES)
def test_nms_seed_dets_form(device):
    boxes, scores = workload_boxes(400, field=300.0)
    dets = torch.cat([boxes, scores[:, None]], 1).to(device)
    expected = as_list(nms(boxes.to(device), scores.to(device), 0.5))
    assert as_list(nms(dets, 0.5)) == expected
    assert as_list(nms(dets, iou_threshold=0.5)) == expected
    assert as_list(nms(dets.T.contiguous().T, 0.5)) == expected  # non-contiguous dets


@pytest.mark.parametrize("device", DEVICES)
def test_nms_non_contiguous_inputs(device):
    boxes, scores = workload_boxes(300, field=300.0)
    strided_boxes = torch.stack([boxes, boxes], 2).reshape(300, 8).to(device)[:, ::2]  # strides (8, 2)
    strided_scores = torch.stack([scores, scores], 1).reshape(-1).to(device)[::2]
    assert not strided_boxes.is_contiguous() and not strided_scores.is_contiguous()
    assert as_list(nms(strided_boxes, strided_scores, 0.5)) == ref_nms(boxes, scores, 0.5)


# ---------------------------------------------------------------- batched_nms
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("classes", [1, 3, 80, 1000])
def test_batched_nms_matches_per_class_nms(device, classes):
    n = 2000
    boxes, scores = workload_boxes(n, field=500.0)
    idxs = torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(classes))
    keep = batched_nms(boxes.to(device), scores.to(device), idxs.to(device), 0.5)
    per_class = []
    for c in idxs.unique():
        sel = torch.nonzero(idxs == c).view(-1)
        per_class += sel[nms(boxes[sel], scores[sel], 0.5)].tolist()
    per_class.sort(key=lambda i: (-float(scores[i]), i))
    assert as_list(keep) == per_class
    assert as_list(keep) == ref_nms(boxes, scores, 0.5, idxs)


@pytest.mark.parametrize("device", DEVICES)
def test_batched_nms_class_ids(device):
    # duplicates in different classes are all kept; negative and int32 class ids work
    boxes = box_tensor([[0, 0, 10, 10]] * 6, device)
    scores = box_tensor([0.5, 0.9, 0.7, 0.5, 0.8, 0.6], device)
    idxs = torch.tensor([-3, 7, -3, 7, 0, 0], dtype=torch.int32, device=device)
    assert as_list(batched_nms(boxes, scores, idxs, 0.5)) == [1, 4, 2]
    assert as_list(batched_nms(boxes, scores, torch.arange(6, device=device), 0.5)) == [1, 4, 2, 5, 0, 3]


@pytest.mark.parametrize("device", DEVICES)
def test_batched_nms_classes_across_tiles(device):
    # classes sorted in runs that straddle the 64-box tile boundaries of the CUDA mask
    boxes, scores = workload_boxes(700, field=200.0)
    idxs = torch.arange(700) // 37 % 5
    keep = batched_nms(boxes.to(device), scores.to(device), idxs.to(device), 0.4)
    assert as_list(keep) == ref_nms(boxes, scores, 0.4, idxs)


# ---------------------------------------------------------------- soft_nms
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["linear", "gaussian"])
@pytest.mark.parametrize("n", [1, 70, 300])
def test_soft_nms_matches_reference(device, method, n):
    boxes, scores = workload_boxes(n, seed=n + 1, field=300.0)
    idx, sc = soft_nms(boxes.to(device), scores.to(device), iou_threshold=0.3, sigma=0.5,
                       score_threshold=0.001, method=method)
    ref_idx, ref_sc = ref_soft_nms(boxes, scores, 0.3, 0.5, 0.001, method)
    assert as_list(idx) == ref_idx
    assert sc.dtype == scores.dtype
    np.testing.assert_array_equal(sc.cpu().numpy(), ref_sc)
    assert bool((sc.cpu().diff() <= 0).all())  # selection order is decreasing decayed score


@pytest.mark.parametrize("device", DEVICES)
def test_soft_nms_structured(device):
    boxes = box_tensor([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 5], [20, 20, 30, 30], [0, 0, 10, 10],
                        [10, 0, 0, 10]], device)
    scores = box_tensor([0.9, 0.9, 0.6, 0.0005, 0.9, 0.3], device)
    for method, thr in [("linear", 0.3), ("gaussian", 0.3), ("linear", 0.0), ("linear", 1.0)]:
        idx, sc = soft_nms(boxes, scores, iou_threshold=thr, method=method, score_threshold=0.01)
        ref_idx, ref_sc = ref_soft_nms(boxes, scores, thr, 0.5, 0.01, method)
        assert as_list(idx) == ref_idx
        np.testing.assert_array_equal(sc.cpu().numpy(), ref_sc)
    # duplicates of the top box decay to 0 under linear and are dropped; the non-overlapping box with
    # a score below score_threshold stays (the reference only drops boxes it decays)
    idx, _ = soft_nms(boxes, scores, iou_threshold=0.3, method="linear", score_threshold=0.01)
    assert as_list(idx)[0] == 0 and 1 not in as_list(idx) and 4 not in as_list(idx) and 3 in as_list(idx)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_soft_nms_dtypes(device, dtype):
    boxes, scores = workload_boxes(150, field=300.0, dtype=dtype)
    scores = scores.to(dtype)
    idx, sc = soft_nms(boxes.to(device), scores.to(device), method="gaussian")
    ref_idx, ref_sc = ref_soft_nms(boxes, scores, 0.3, 0.5, 0.001, "gaussian")
    assert as_list(idx) == ref_idx
    assert sc.dtype == dtype
    # float64: the GPU's exp may differ from libm's in the last bit
    tol = 1e-14 if dtype == torch.float64 else 0
    torch.testing.assert_close(sc.cpu(), torch.from_numpy(ref_sc).to(dtype), rtol=tol, atol=0)


# ---------------------------------------------------------------- CPU == CUDA, torchvision
@requires_cuda
@pytest.mark.parametrize("n", [1, 64, 1000, 10000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cpu_equals_cuda(n, dtype):
    boxes, scores = workload_boxes(n, dtype=dtype)
    idxs = torch.randint(0, 80, (n,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(nms(boxes, scores, 0.5), nms(boxes.cuda(), scores.cuda(), 0.5).cpu())
    assert torch.equal(batched_nms(boxes, scores, idxs, 0.5),
                       batched_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), 0.5).cpu())
    if n <= 1000:
        for method in ["linear", "gaussian"]:
            a = soft_nms(boxes, scores, method=method)
            b = soft_nms(boxes.cuda(), scores.cuda(), method=method)
            assert torch.equal(a[0], b[0].cpu())
            torch.testing.assert_close(a[1], b[1].cpu(), rtol=1e-6, atol=0)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("n", [1, 63, 65, 255, 256, 257, 511, 512, 513])
def test_cuda_one_launch_path_equals_general_path_and_reference(dtype, n):
    # Scores of the boxes' dtype and up to 512 boxes (256 for float64) take the one-launch kernel;
    # the same scores in another dtype (exactly representable) take the sort + mask + scan path.
    boxes, scores = workload_boxes(n, seed=n + 7, field=300.0, dtype=dtype)  # dense: much suppression
    scores = (scores * 16).floor().to(dtype)  # many equal scores: ties by index
    other = torch.float64 if dtype != torch.float64 else torch.float32
    idxs = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(n)).to(torch.int32)
    b, s, s_other, c = boxes.cuda(), scores.cuda(), scores.to(other).cuda(), idxs.cuda()
    for thr in [0.3, 0.6]:
        one = nms(b, s, thr)
        assert one.dtype == torch.int64 and one.device == b.device
        assert torch.equal(one, nms(b, s_other, thr))
        assert as_list(one) == ref_nms(boxes, scores, thr)
        one_b = batched_nms(b, s, c, thr)
        assert torch.equal(one_b, batched_nms(b, s_other, c, thr))
        assert as_list(one_b) == ref_nms(boxes, scores, thr, idxs)  # in rank order
    dets = torch.cat([b, s[:, None]], 1)  # strided boxes and scores
    assert torch.equal(nms(dets, 0.5), nms(b, s_other, 0.5))


@requires_cuda
def test_cuda_many_boxes_removed_bitset_in_global_memory():
    # more than 327,680 boxes: the scan keeps its 'removed' bitset in global memory
    n = 340_000
    boxes, scores = workload_boxes(n, field=300.0)
    keep = nms(boxes.cuda(), scores.cuda(), 0.5)
    assert torch.equal(keep.cpu(), nms(boxes, scores, 0.5))
    idxs = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(2))
    assert torch.equal(batched_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), 0.5).cpu(),
                       batched_nms(boxes, scores, idxs, 0.5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1000, 10000])
def test_matches_torchvision(device, n):
    tv_ops = torchvision_or_skip()
    boxes, scores = workload_boxes(n)
    boxes, scores = boxes.to(device), scores.to(device)
    ours, theirs = nms(boxes, scores, 0.5), tv_ops.nms(boxes, scores, 0.5)
    assert set(as_list(ours)) == set(as_list(theirs))
    idxs = torch.randint(0, 80, (n,), generator=torch.Generator().manual_seed(n)).to(device)
    ours, theirs = batched_nms(boxes, scores, idxs, 0.5), tv_ops.batched_nms(boxes, scores, idxs, 0.5)
    assert set(as_list(ours)) == set(as_list(theirs))


# ---------------------------------------------------------------- as a PyTorch op
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    boxes, scores = workload_boxes(200, field=300.0)
    boxes, scores = boxes.to(device), scores.to(device)
    idxs = (torch.arange(200, device=device) % 7)
    torch.library.opcheck(torch.ops.orbbec.nms.default, (boxes, scores, 0.5))
    torch.library.opcheck(torch.ops.orbbec.nms.default, (boxes.half(), scores, 0.3))
    torch.library.opcheck(torch.ops.orbbec.batched_nms.default, (boxes, scores, idxs, 0.5))
    torch.library.opcheck(torch.ops.orbbec.soft_nms.default, (boxes, scores, 0.3, 0.5, 0.001, 1))
    torch.library.opcheck(torch.ops.orbbec.soft_nms.default, (boxes, scores, 0.3, 0.5, 0.001, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    boxes, scores = workload_boxes(300, field=300.0)
    boxes, scores = boxes.to(device), scores.to(device)
    idxs = torch.arange(300, device=device) % 4

    def postprocess(b, s, c):
        keep = nms(b, s, 0.5)
        kept_boxes = b[keep]
        by_class = batched_nms(b, s, c, 0.5)
        soft_idx, soft_scores = soft_nms(b, s, method="gaussian")
        return keep, kept_boxes * 2, by_class, soft_idx, soft_scores + 1

    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        torch._dynamo.reset()
        compiled = torch.compile(postprocess, fullgraph=True)
        got = compiled(boxes, scores, idxs)
    expected = postprocess(boxes, scores, idxs)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    boxes, scores = workload_boxes(10)
    boxes, scores = boxes.to(device), scores.to(device)
    idxs = torch.zeros(10, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="'boxes'"):
        nms(boxes[:, :3], scores, 0.5)
    with pytest.raises(ValueError, match="'boxes'"):
        nms(boxes[None], scores, 0.5)
    with pytest.raises(ValueError, match="'scores'"):
        nms(boxes, scores[:9], 0.5)
    with pytest.raises(ValueError, match="'scores'"):
        nms(boxes, scores[:, None], 0.5)
    with pytest.raises(TypeError, match="'boxes'"):
        nms(boxes.round().int(), scores, 0.5)
    with pytest.raises(TypeError, match="'scores'"):
        nms(boxes, (scores * 10).long(), 0.5)
    with pytest.raises(ValueError, match="'iou_threshold'"):
        nms(boxes, scores, float("nan"))
    with pytest.raises(TypeError, match="'iou_threshold'"):
        nms(boxes, scores, "0.5")
    with pytest.raises(ValueError, match="'dets'"):
        nms(boxes, 0.5)
    with pytest.raises(ValueError, match="'idxs'"):
        batched_nms(boxes, scores, idxs[:5], 0.5)
    with pytest.raises(TypeError, match="'idxs'"):
        batched_nms(boxes, scores, idxs.float(), 0.5)
    with pytest.raises(ValueError, match="'method'"):
        soft_nms(boxes, scores, method="hard")
    with pytest.raises(ValueError, match="'sigma'"):
        soft_nms(boxes, scores, sigma=0.0, method="gaussian")
    # the op itself checks too (direct torch.ops calls)
    with pytest.raises(ValueError, match="'boxes'"):
        torch.ops.orbbec.nms(boxes[:, :3], scores, 0.5)
    with pytest.raises(TypeError, match="'boxes'"):
        torch.ops.orbbec.nms(boxes.int(), scores, 0.5)
    with pytest.raises(ValueError, match="'scores'"):
        torch.ops.orbbec.batched_nms(boxes, scores[:3], idxs, 0.5)
    with pytest.raises(TypeError, match="'idxs'"):
        torch.ops.orbbec.batched_nms(boxes, scores, idxs.double(), 0.5)
    with pytest.raises(ValueError, match="'method'"):
        torch.ops.orbbec.soft_nms(boxes, scores, 0.3, 0.5, 0.001, 3)


@requires_cuda
def test_bad_devices():
    boxes, scores = workload_boxes(10)
    idxs = torch.zeros(10, dtype=torch.int64)
    with pytest.raises(ValueError, match="'idxs'"):
        batched_nms(boxes.cuda(), scores.cuda(), idxs, 0.5)
    with pytest.raises(ValueError, match="'scores'"):
        nms(boxes.cuda(), scores, 0.5)
    with pytest.raises(ValueError, match="'idxs'"):
        torch.ops.orbbec.batched_nms(boxes.cuda(), scores.cuda(), idxs, 0.5)

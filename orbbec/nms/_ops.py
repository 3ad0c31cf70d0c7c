"""Fake (meta) kernels of the NMS ops, so that they trace under torch.compile / torch.export.

Every output size is data-dependent: the number of kept boxes is a new unbacked symbolic size
(torch.compile needs `torch._dynamo.config.capture_dynamic_output_shape_ops = True` to keep such
an op in the graph). The ops are not differentiable (indices; soft_nms scores carry no gradient).
"""
import torch


def _kept(n):
    ctx = torch.library.get_ctx()
    return ctx.new_dynamic_size(min=0, max=n) if isinstance(n, int) else ctx.new_dynamic_size()


@torch.library.register_fake("orbbec::nms")
def _nms_fake(boxes, scores, iou_threshold):
    torch._check(boxes.dim() == 2 and boxes.shape[1] == 4, lambda: "orbbec: 'boxes' must have shape [N, 4]")
    torch._check(scores.shape == boxes.shape[:1], lambda: "orbbec: 'scores' must hold one score per box")
    return boxes.new_empty((_kept(boxes.shape[0]),), dtype=torch.long)


@torch.library.register_fake("orbbec::batched_nms")
def _batched_nms_fake(boxes, scores, idxs, iou_threshold):
    torch._check(boxes.dim() == 2 and boxes.shape[1] == 4, lambda: "orbbec: 'boxes' must have shape [N, 4]")
    torch._check(scores.shape == boxes.shape[:1], lambda: "orbbec: 'scores' must hold one score per box")
    torch._check(idxs.shape == boxes.shape[:1], lambda: "orbbec: 'idxs' must hold one class id per box")
    return boxes.new_empty((_kept(boxes.shape[0]),), dtype=torch.long)


@torch.library.register_fake("orbbec::soft_nms")
def _soft_nms_fake(boxes, scores, iou_threshold, sigma, score_threshold, method):
    torch._check(boxes.dim() == 2 and boxes.shape[1] == 4, lambda: "orbbec: 'boxes' must have shape [N, 4]")
    torch._check(scores.shape == boxes.shape[:1], lambda: "orbbec: 'scores' must hold one score per box")
    k = _kept(boxes.shape[0])
    return boxes.new_empty((k,), dtype=torch.long), scores.new_empty((k,))

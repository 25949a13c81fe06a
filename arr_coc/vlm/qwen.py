"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL adapters: the frozen model encodes chosen cells at their true place.

Shapes: ``Hc, Wc`` token cells of an image; ``m`` the spatial merge (2); ``K`` chosen cells;
``P`` patch side (14 or 16 px); ``T`` temporal patch (2); one cell = m x m patches = one LLM token.

The vision towers take their rotary ``position_ids``, ``cu_seqlens``, window order (Qwen2.5) and
position-table interpolation (Qwen3) as precomputed keyword arguments; computing those for an
arbitrary set of cells is what lets the unmodified tower encode only the saccades, each with the
position it has in the full-resolution image. Gestalt and saccades of every image in a batch go
through the tower in one call, as separate attention segments.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from arr_coc.engine.imageops import resize, shrink_squares
from arr_coc.vlm.processing import (
    CLIP_MEAN,
    CLIP_STD,
    VisualTokens,
    all_cells,
    box_centres,
    chat_ids,
    check_boxes,
    check_options,
    image_grid,
    left_pad,
    mode_cells,
    per_image,
    split_at_images,
    table_taps,
)
from arr_coc.vlm.protocol import ADAPTERS, FIRST_LOOK, PROCESSOR, VLMAdapter
from arr_coc.vlm.qwen_layout import Segment, patch_positions, patchify, visual_positions, window_order


class QwenVLAdapter(VLMAdapter):
    """Qwen2-VL: full attention in the tower, M-RoPE in the LLM. Subclasses add what their tower needs."""

    name = "qwen2_vl"
    rope_rows = 3
    capabilities = frozenset({FIRST_LOOK, PROCESSOR})
    default_mean, default_std = CLIP_MEAN, CLIP_STD

    def __init__(self, model: Any, tokenizer: Any = None, *, processor: Any = None,
                 image_mean: Sequence[float] | None = None, image_std: Sequence[float] | None = None) -> None:
        self.model, self.processor = model.eval(), processor
        self.tokenizer = tokenizer if tokenizer is not None else getattr(processor, "tokenizer", None)
        ip = getattr(processor, "image_processor", None)
        vc = model.config.vision_config
        self.patch, self.merge, self.temporal = vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size
        self.cell = self.patch * self.merge
        self.text_config = model.config.text_config
        self.image_token_id = model.config.image_token_id
        mean = image_mean or getattr(ip, "image_mean", None) or self.default_mean
        std = image_std or getattr(ip, "image_std", None) or self.default_std
        self.mean, self.std = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
        self.visual, self.lm, self.head = model.model.visual, model.model.language_model, model.lm_head

    # ------------------------------------------------------------------ vision tower
    def normalize(self, image: Tensor) -> Tensor:
        """[3, H, W] in [0, 1] -> the tower's input scale."""
        return (image - self.mean.to(image)) / self.std.to(image)

    def tower_kwargs(self, segments: Sequence[Segment]) -> dict[str, Tensor]:
        """Precomputed tower inputs for the segments: rotary positions and attention segments."""
        mm = self.merge * self.merge
        dev = segments[0].patches.device
        lengths = torch.tensor([len(s.cells) * mm for s in segments], device=dev)
        return {"position_ids": torch.cat([patch_positions(s.cells, self.merge, s.sizes) for s in segments]),
                "cu_seqlens": F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)}

    def tower_outputs(self, out: Any) -> tuple[Tensor, list[Tensor]]:
        return out.pooler_output, []

    @torch.no_grad()
    def encode_segments(self, segments: Sequence[Segment]) -> list[tuple[Tensor, list[Tensor]]]:
        """One tower call over every segment -> per segment (merged tokens [n, D], deepstack [[n, D]])."""
        pixels = torch.cat([s.patches for s in segments]).to(self.visual.dtype)
        thw = torch.tensor([[1, self.merge, self.merge * len(s.cells)] for s in segments])  # patch counts only
        out = self.visual(pixels, grid_thw=thw, **self.tower_kwargs(segments))
        tokens, deep = self.tower_outputs(out)
        sizes = [len(s.cells) for s in segments]
        return [(t, [d[i] for d in [x.split(sizes) for x in deep]])
                for i, t in enumerate(tokens.split(sizes))]

    # ------------------------------------------------------------------ visual tokens
    def gestalt_image(self, image: Tensor, grid: tuple[int, int]) -> Tensor:
        """The image shrunk to ``grid`` cells (antialiased), for the model's own low-res encoding."""
        size = (grid[0] * self.cell, grid[1] * self.cell)
        return resize(image.float(), size)

    @torch.no_grad()
    def encode(self, images: Sequence[Tensor], cells: Sequence[Tensor | None], *, mode: str = "sparse",
               gestalt: Sequence[tuple[int, int] | None] | None = None, layout: str = "scaled",
               weights: Sequence[Tensor | None] | None = None,
               encoded: Sequence[VisualTokens | None] | None = None) -> list[VisualTokens]:
        """Gestalt + saccade tokens per image.

        Args:
            images: each [3, H, W] in [0, 1], H and W multiples of ``cell``.
            cells: each [K, 2] (y, x) chosen cells in relevance order (ignored by ``weighted``).
            mode: ``sparse`` encodes only the chosen cells; ``slice`` encodes the full grid and keeps
                the chosen tokens; ``weighted`` keeps every token, scaled by ``weights`` [Hc, Wc].
            gestalt: per image the gestalt grid (rows, cols) or None for no gestalt.
            layout: how saccades are placed relative to the gestalt (see :func:`visual_positions`).
            encoded: per image its gestalt tokens already encoded (:meth:`encode_gestalt`, the first
                look): reused instead of encoded again.
        """
        check_options(mode, layout)
        cells, gestalt, weights = per_image(len(images), cells=cells, gestalt=gestalt, weights=weights)
        (encoded,) = per_image(len(images), encoded=encoded)
        segments, plan = [], []
        device = self.visual.device  # the model may sit on a GPU while the canvas is on the CPU
        for img, chosen, g, w, done in zip(images, cells, gestalt, weights, encoded):
            hc, wc = image_grid(img, self.cell)
            img = img.to(device)
            x = self.normalize(img.float())
            rows = patchify(x, self.patch, self.merge, self.temporal)
            # a page of a context may get no saccades: its gestalt alone
            chosen = mode_cells(mode, chosen, w, (hc, wc), x.device, allow_empty=g is not None and mode == "sparse")
            flat = chosen[:, 0] * wc + chosen[:, 1]
            if g is not None and done is None:
                segments.append(self.gestalt_segment(img, g))
            if mode == "sparse" and len(flat):
                mm = self.merge * self.merge
                segments.append(Segment(rows.view(hc * wc, mm, -1)[flat].reshape(len(flat) * mm, -1), chosen, (hc, wc)))
            elif mode != "sparse":
                segments.append(Segment(rows, all_cells(hc, wc, x.device), (hc, wc)))
            plan.append((g, chosen, flat, (hc, wc), w, done))
        outputs = iter(self.encode_segments(segments))
        out = []
        for g, chosen, flat, grid, w, done in plan:
            parts = [self.reused(done, g) if done is not None else next(outputs)] if g is not None else []
            if not len(flat):
                segs = tuple(len(p[0]) * self.merge ** 2 for p in parts)
                out.append(self.visual_tokens(parts, True, visual_positions(g, chosen, grid, layout), segs))
                continue
            tok, deep = next(outputs)
            segs = tuple(len(p[0]) * self.merge ** 2 for p in parts) + (len(tok) * self.merge ** 2,)
            if mode == "slice":
                tok, deep = tok[flat], [d[flat] for d in deep]
            elif mode == "weighted":
                tok = tok * w.reshape(-1, 1).to(tok)
            parts.append((tok, deep))
            out.append(self.visual_tokens(parts, g is not None, visual_positions(g, chosen, grid, layout), segs))
        return out

    @torch.no_grad()
    def encode_gestalt(self, images: Sequence[Tensor], grids: Sequence[tuple[int, int]]) -> list[VisualTokens]:
        """Only the gestalt of each image, at its place: the first look, before any saccade is chosen.

        The gestalt is its own attention segment in :meth:`encode`, so these tokens are the ones
        ``encode`` gives with the saccades, and ``encode(..., encoded=...)`` reuses them.
        """
        images, grids = per_image(len(images), images=images, grids=grids)
        device = self.visual.device
        segments = [self.gestalt_segment(img.to(device).float(), g) for img, g in zip(images, grids)]
        out = []
        for (tok, deep), g in zip(self.encode_segments(segments), grids):
            out.append(self.visual_tokens([(tok, deep)], True, visual_positions(g, tok.new_zeros(0, 2), g),
                                          (len(tok) * self.merge ** 2,)))
        return out

    def reused(self, done: VisualTokens, grid: tuple[int, int]) -> tuple[Tensor, list[Tensor]]:
        """An already encoded gestalt as (tokens, deepstack), checked against the grid it must have."""
        if done.n_gestalt != grid[0] * grid[1] or len(done) != done.n_gestalt:
            raise ValueError(f"an encoded gestalt must hold the {grid[0]}x{grid[1]} gestalt tokens only, "
                             f"got {len(done)} tokens ({done.n_gestalt} gestalt)")
        return done.embeds, list(done.deepstack)

    def gestalt_segment(self, image: Tensor, grid: tuple[int, int]) -> Segment:
        """Every cell of the image shrunk to the gestalt ``grid``: the model's own low-resolution view."""
        rows = patchify(self.normalize(self.gestalt_image(image, grid)), self.patch, self.merge, self.temporal)
        return Segment(rows, all_cells(*grid, image.device), grid)

    @staticmethod
    def visual_tokens(parts: list[tuple[Tensor, list[Tensor]]], has_gestalt: bool, positions: Tensor,
                      segments: tuple[int, ...]) -> VisualTokens:
        """One image's encoded parts ([gestalt,] saccades; tokens and deepstack each) as VisualTokens."""
        deepstack = [torch.cat([p[1][j] for p in parts]) for j in range(len(parts[0][1]))]
        return VisualTokens(torch.cat([p[0] for p in parts]), positions, len(parts[0][0]) if has_gestalt else 0,
                            deepstack, segments)

    def encode_native(self, images: Sequence[Tensor]) -> list[VisualTokens]:
        """Every cell at full resolution, native positions: what the model sees without arr-coc."""
        return self.encode(images, [all_cells(i.shape[1] // self.cell, i.shape[2] // self.cell) for i in images],
                           mode="slice")

    def image_processor(self) -> Any:
        """The checkpoint's own image processor, or the family's (Qwen2-VL's, whose resize all three share)
        built from the tower's patch, merge and normalisation when the checkpoint has none."""
        ip = getattr(self.processor, "image_processor", None)
        if ip is not None:
            return ip
        from transformers import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil(patch_size=self.patch, merge_size=self.merge, temporal_patch_size=self.temporal,
                                        image_mean=self.mean.flatten().tolist(), image_std=self.std.flatten().tolist())

    @torch.no_grad()
    def encode_processed(self, images: Sequence[Any], max_tokens: int) -> list[VisualTokens]:
        """The model's own view at a token cap: its image processor resizes each image (PIL) to at most
        ``max_tokens`` cells (``max_pixels = max_tokens * cell**2``), the tower encodes every cell at its
        native position. ``max_tokens`` at or above the image's own size gives the native full resolution.
        """
        ip, mm = self.image_processor(), self.merge * self.merge
        max_px = int(max_tokens) * self.cell ** 2
        if max_px < self.cell ** 2:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        smallest = min(getattr(ip.size, "shortest_edge", None) or 4 * self.cell ** 2, max_px)
        device, segments = self.visual.device, []
        for image in images:
            cap = max_px
            while True:  # the processor keeps every side >= one cell, so a thin image can overshoot its cap
                out = ip(images=[image], size={"shortest_edge": min(smallest, cap), "longest_edge": cap},
                         return_tensors="pt")
                _, h, w = out["image_grid_thw"][0].tolist()  # in patches
                grid = (h // self.merge, w // self.merge)
                if grid[0] * grid[1] <= max_tokens:
                    break
                if cap <= self.cell ** 2:
                    raise ValueError(f"the model's processor cannot fit a {image.size[0]}x{image.size[1]} image "
                                     f"in {max_tokens} tokens (it keeps {grid[0]}x{grid[1]} cells)")
                cap = max(self.cell ** 2, cap * max_tokens // (grid[0] * grid[1]) - 1)
            segments.append(Segment(out["pixel_values"].to(device), all_cells(*grid, device), grid))
        encoded = self.encode_segments(segments)
        return [self.visual_tokens([e], False, visual_positions(None, s.cells, s.grid), (len(s.cells) * mm,))
                for e, s in zip(encoded, segments)]

    @torch.no_grad()
    def encode_patches(self, images: Sequence[Tensor], boxes: Sequence[Tensor], *,
                       gestalt: Sequence[tuple[int, int] | None] | None = None, layout: str = "scaled",
                       encoded: Sequence[VisualTokens | None] | None = None) -> list[VisualTokens]:
        """Variable-size patches (``arr_coc.allocators.patching``): each square shrunk to one token at its true place.

        Args:
            images: each [3, H, W] in [0, 1], sides multiples of ``cell``.
            boxes: each [K, 3] (y, x, size) in cells; a size-s square is resized to one cell and its
                patches get the rotary (and, on Qwen3-VL, position-table) coordinates of the centres
                of what they stand for; in the LLM it sits at the square's centre.
            gestalt, layout, encoded: as in :meth:`encode`.
        """
        check_options(layout=layout)
        boxes, gestalt = per_image(len(images), boxes=boxes, gestalt=gestalt)
        (encoded,) = per_image(len(images), encoded=encoded)
        device, segments, plan = self.visual.device, [], []
        for img, bx, g, done in zip(images, boxes, gestalt, encoded):
            hc, wc = image_grid(img, self.cell)
            img = img.to(device).float()
            bx = check_boxes(bx, (hc, wc), device)
            crops = shrink_squares(img, bx, self.cell)  # [K, 3, cell, cell]
            rows = torch.cat([patchify(self.normalize(p), self.patch, self.merge, self.temporal) for p in crops])
            if g is not None and done is None:
                segments.append(self.gestalt_segment(img, g))
            segments.append(Segment(rows, bx[:, :2], (hc, wc), bx[:, 2]))
            plan.append((g, bx, (hc, wc), done))
        outputs = iter(self.encode_segments(segments))
        out = []
        for g, bx, grid, done in plan:
            parts = [self.reused(done, g) if done is not None else next(outputs)] if g is not None else []
            parts.append(next(outputs))
            centres = box_centres(bx)  # [K, 2] the square's centre, in cells
            segs = tuple(len(p[0]) * self.merge ** 2 for p in parts)
            out.append(self.visual_tokens(parts, g is not None, visual_positions(g, centres, grid, layout), segs))
        return out

    # ------------------------------------------------------------------ language model
    def prompt_segments(self, question: str, images: int = 1) -> list[list[int]]:
        """Chat-templated prompt around ``images`` image placeholders -> the images + 1 runs of ids between them."""
        cfg = self.model.config
        lead = [cfg.vision_start_token_id, self.image_token_id, cfg.vision_end_token_id]  # the bare image block
        return split_at_images(chat_ids(self.tokenizer, self.processor, question, self.image_token_id, lead, images),
                               self.image_token_id, images)

    def language_model(self, x: dict) -> Tensor:
        out = self.lm(inputs_embeds=x["inputs_embeds"], attention_mask=x["attention_mask"],
                      position_ids=x["position_ids"], cache=x.get("past_key_values"),
                      use_cache=x.get("past_key_values") is not None, **self.deepstack_kwargs(x))
        return out.last_hidden_state

    def deepstack_kwargs(self, x: dict) -> dict:
        return {}

    def native_inputs(self, images: Sequence[Tensor | Sequence[Tensor]], questions: Sequence[str]) -> dict[str, Tensor]:
        """Inputs for the model's own forward (image placeholders expanded, patches, grids): the reference.

        ``images[b]``: one image, or the pages of prompt b, each its own placeholder expanded to its grid
        and its own row of ``image_grid_thw``, as the model's processor lays out several images.
        """
        ids, thw, pix = [], [], []
        for pages, q in zip(images, questions):
            pages = [pages] if isinstance(pages, Tensor) else list(pages)
            runs = self.prompt_segments(q, len(pages))
            row = list(runs[0])
            for img, run in zip(pages, runs[1:]):
                hc, wc = image_grid(img, self.cell)
                row += [self.image_token_id] * (hc * wc) + list(run)
                thw.append([1, hc * self.merge, wc * self.merge])
                pix.append(patchify(self.normalize(img.float()), self.patch, self.merge, self.temporal))
            ids.append(row)
        input_ids, mask = left_pad(ids, self.text_config.pad_token_id or 0)
        return {"input_ids": input_ids, "attention_mask": mask, "pixel_values": torch.cat(pix),
                "image_grid_thw": torch.tensor(thw), "mm_token_type_ids": (input_ids == self.image_token_id).int() * mask}


@ADAPTERS.register("qwen2_vl")
class Qwen2VLAdapter(QwenVLAdapter):
    """Qwen2-VL (the base class as is)."""


@ADAPTERS.register("qwen2_5_vl")
class Qwen25VLAdapter(QwenVLAdapter):
    """Qwen2.5-VL: adds window attention, recomputed for the chosen cells of each segment."""

    name = "qwen2_5_vl"

    def tower_kwargs(self, segments: Sequence[Segment]) -> dict[str, Tensor]:
        kw = super().tower_kwargs(segments)
        vc = self.model.config.vision_config
        window = vc.window_size // self.merge // self.patch  # cells per window side
        orders, sizes, offset = [], [], 0
        for s in segments:
            order, counts = window_order(s.cells, s.grid, window)
            orders.append(order + offset)
            sizes.append(counts)
            offset += len(s.cells)
        cu = torch.cat(sizes).cumsum(0) * self.merge ** 2
        kw.update(window_index=torch.cat(orders), cu_window_seqlens=F.pad(cu, (1, 0)).to(torch.int32))
        return kw


@ADAPTERS.register("qwen3_vl")
class Qwen3VLAdapter(QwenVLAdapter):
    """Qwen3-VL: adds the interpolated absolute position table and the DeepStack features."""

    name = "qwen3_vl"
    default_mean, default_std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)

    def tower_kwargs(self, segments: Sequence[Segment]) -> dict[str, Tensor]:
        from transformers.vision_utils import get_vision_interpolation_indices_and_weights

        kw = super().tower_kwargs(segments)
        mm, idx, wts = self.merge ** 2, [], []
        for s in segments:
            thw = torch.tensor([[1, s.grid[0] * self.merge, s.grid[1] * self.merge]], device=s.cells.device)
            i, w = get_vision_interpolation_indices_and_weights(
                thw, self.visual.num_grid_per_side, mode=self.visual.interpolation_mode,
                align_corners=self.visual.interpolation_align_corners, spatial_merge_size=self.merge)
            if s.sizes is not None and bool((s.sizes > 1).any()):  # centres between grid points
                ti, tw = table_taps(patch_positions(s.cells, self.merge, s.sizes), thw[0, 1:],
                                    self.visual.num_grid_per_side)
                idx.append(ti)
                wts.append(tw.to(w.dtype))
                continue
            rows = ((s.cells[:, 0] * s.grid[1] + s.cells[:, 1])[:, None] * mm
                    + torch.arange(mm, device=s.cells.device)).flatten()  # cell-major patch rows
            idx.append(i[rows])
            wts.append(w[rows])
        kw.update(interp_indices=torch.cat(idx), interp_weights=torch.cat(wts))
        return kw

    def tower_outputs(self, out: Any) -> tuple[Tensor, list[Tensor]]:
        return out.pooler_output, list(out.deepstack_features)

    def deepstack_kwargs(self, x: dict) -> dict:
        if not x.get("deepstack"):
            return {}
        return {"visual_pos_masks": x["visual_mask"], "deepstack_visual_embeds": x["deepstack"]}

"""LLaVA adapter: the model's own 336 px view as the gestalt, full-resolution CLIP cells as saccades.

Shapes: ``S`` the tower's square input side (336 px for LLaVA-1.5); ``P`` the CLIP patch (14 px), one
patch = one LLM token = one cell; ``g = S // P`` patches per tile side (24); ``Hc, Wc`` cells of the
full image; ``K`` chosen cells (or variable-size boxes); ``D`` the LLM width; ``Dv`` the tower width.

The full image is cut into S x S tiles, so every saccade is encoded by the unmodified tower at its
native resolution with the position embedding of its place inside its tile. A variable-size patch
(:meth:`LlavaAdapter.encode_patches`) is a square of cells shrunk to one cell, placed at its centre
by reading the position table bilinearly between slots. The LLM uses a plain 1-D RoPE, so visual
tokens simply follow each other: gestalt, then saccades in relevance order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from arr_coc.engine.imageops import resize, shrink_squares
from arr_coc.vlm.processing import (
    CLIP_MEAN,
    CLIP_STD,
    VisualTokens,
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
from arr_coc.vlm.protocol import ADAPTERS, FIRST_LOOK, VLMAdapter


def to_tiles(image: Tensor, size: int) -> Tensor:
    """[C, H, W] -> [Th * Tw, C, size, size] row-major tiles; the last row/column is zero-padded.

    Zero after normalisation is the mean colour, the neutral fill LLaVA pads images with.

    >>> to_tiles(torch.ones(3, 5, 9), 4).shape
    torch.Size([6, 3, 4, 4])
    """
    c, h, w = image.shape
    th, tw = -(-h // size), -(-w // size)
    x = F.pad(image, (0, tw * size - w, 0, th * size - h))
    return x.reshape(c, th, size, tw, size).permute(1, 3, 0, 2, 4).reshape(th * tw, c, size, size)


def to_patches(tile: Tensor, patch: int) -> Tensor:
    """[C, S, S] -> [g * g, C, P, P] patches in raster order (CLIP's token order).

    >>> to_patches(torch.arange(16.).view(1, 4, 4), 2)[1].flatten().tolist()
    [2.0, 3.0, 6.0, 7.0]
    """
    c, s, _ = tile.shape
    g = s // patch
    return tile.reshape(c, g, patch, g, patch).permute(1, 3, 0, 2, 4).reshape(g * g, c, patch, patch)


def box_places(boxes: Tensor, side: int, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Where each (y, x, size) square of cells is encoded: its tile [K] and in-tile (row, col) [K, 2] float.

    A square goes to the tile holding its centre ``(y, x) + (size - 1) / 2`` (a centre half-way
    between two tiles goes to the upper / left one) and sits at that centre's coordinate inside the
    tile, clamped to the ``side x side`` position table. A square that straddles a tile boundary is
    thus attended with the patches of one tile and placed at most half a cell from its true centre;
    a size-1 box lands exactly on its cell's slot.

    >>> tile, at = box_places(torch.tensor([[5, 1, 1], [0, 0, 2], [3, 1, 2]]), 4, (7, 9))
    >>> tile.tolist(), at.tolist()  # 3 tiles per row; the last square straddles rows 3 | 4
    ([3, 0, 0], [[1.0, 1.0], [0.5, 0.5], [3.0, 1.5]])
    """
    centre = box_centres(boxes)  # [K, 2] in cells of the full image
    ty, tx = (centre.floor().long() // side).unbind(1)
    tile = ty * -(-grid[1] // side) + tx
    return tile, (centre - torch.stack([ty, tx], 1) * side).clamp(0, side - 1)


@dataclass
class Plan:
    """What one image takes from the encoders: its gestalt row, its tiles' rows, or its sparse tokens."""

    tile: Tensor  # [K] row-major tile of each chosen cell or box
    inner: Tensor | None = None  # [K] raster index of each chosen cell inside its tile (slice, weighted)
    weights: Tensor | None = None  # [Hc, Wc] (weighted mode)
    gestalt: int | None = None  # row of the gestalt in the batched tower input
    tiles: tuple[int, Tensor] | None = None  # (first row, sorted tile ids) in the batched tower input
    tokens: Tensor | None = None  # [K, D] sparse saccade tokens
    segments: list[int] = field(default_factory=list)  # patches per tower attention segment


@ADAPTERS.register("llava")
class LlavaAdapter(VLMAdapter):
    """LLaVA (CLIP tower, MLP projector, 1-D RoPE LLM): gestalt + saccades through the frozen model.

    No first look (its gestalt is the tower's fixed S x S view, encoded with the tiles) and no
    processor view; one layout: the 1-D RoPE sends tokens in sequence.
    """

    name = "llava"
    rope_rows = 1
    merge = 1  # one patch per LLM token
    layouts = ("scaled",)

    def __init__(self, model: Any, tokenizer: Any = None, *, processor: Any = None,
                 image_mean: Sequence[float] | None = None, image_std: Sequence[float] | None = None) -> None:
        self.model, self.processor = model.eval(), processor
        self.tokenizer = tokenizer if tokenizer is not None else getattr(processor, "tokenizer", None)
        cfg, vc = model.config, model.config.vision_config
        if vc.image_size % vc.patch_size:
            raise ValueError(f"the tower's image_size {vc.image_size} is not a multiple of its patch {vc.patch_size}")
        self.cell, self.size = vc.patch_size, vc.image_size
        self.side = self.size // self.cell
        self.text_config, self.image_token_id = cfg.text_config, cfg.image_token_id
        self.feature_layer, self.strategy = cfg.vision_feature_layer, cfg.vision_feature_select_strategy
        # "full" keeps CLS in front of the patch tokens
        self.native_tokens = self.side ** 2 + (self.strategy == "full")
        # the gestalt is the tower's own S x S view, whatever grid a budget split asks for: a total of T tokens
        # cannot be split between gestalt and saccades (arr_coc.vlm.answer.refuse_total_tokens)
        self.fixed_gestalt = self.native_tokens
        mean, std = image_mean or CLIP_MEAN, image_std or CLIP_STD
        self.mean, self.std = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
        self.visual, self.projector = model.model.vision_tower, model.model.multi_modal_projector
        self.lm, self.head = model.model.language_model, model.lm_head

    # ------------------------------------------------------------------ vision tower
    def normalize(self, image: Tensor) -> Tensor:
        """[3, H, W] in [0, 1] -> the tower's input scale, on the tower's device."""
        image = image.float().to(self.visual.device)
        return (image - self.mean.to(image)) / self.std.to(image)

    def gestalt_image(self, image: Tensor) -> Tensor:
        """The whole image squeezed (antialiased) to the tower's S x S input: nothing is cropped away."""
        return resize(image.float(), (self.size, self.size))

    @torch.no_grad()
    def tile_features(self, tiles: Tensor) -> Tensor:
        """LLaVA's own image features of S x S tiles: [T, C, S, S] normalised -> [T, native_tokens, D]."""
        out = self.model.model.get_image_features(pixel_values=tiles, vision_feature_layer=self.feature_layer,
                                                  vision_feature_select_strategy=self.strategy)
        return torch.stack(list(out.pooler_output))

    def position_at(self, at: Tensor) -> Tensor:
        """The tower's patch position embeddings [k, Dv] at in-tile (row, col) slots [k, 2], float.

        Bilinear between the four surrounding slots of the learned ``side x side`` table (coordinates
        clamped to it); a whole-number slot reads its table row exactly (weights 1, 0, 0, 0).
        """
        table = self.visual.embeddings.position_embedding.weight  # [1 + side^2, Dv]; row 0 is CLS
        g = self.side
        idx, w = table_taps(at.clamp(0, g - 1), torch.tensor([g, g], device=at.device), g)  # [k, 4] each
        return (w[..., None].to(table) * table[1 + idx]).sum(1)

    @torch.no_grad()
    def tower_tokens(self, patches: Tensor, at: Tensor) -> Tensor:
        """LLM tokens [k, D] of normalised patches [k, C, P, P] placed at in-tile slots ``at`` [k, 2] float.

        The CLIP tower is composed from its public parts so that it attends over CLS + these patches
        alone, each with the position embedding of ``at`` (:meth:`position_at`).
        """
        emb = getattr(self.visual, "embeddings", None)
        if not all(hasattr(m, a) for m, a in [(emb, "class_embedding"), (emb, "position_embedding"),
                                               (self.visual, "pre_layrnorm"), (self.visual, "encoder")]):
            raise ValueError(f"sparse mode and encode_patches need a CLIP vision tower, not "
                             f"{type(self.visual).__name__}; use mode='slice'")
        weight = emb.patch_embedding.weight
        x = emb.patch_embedding(patches.to(weight.device, weight.dtype)).flatten(1)  # [k, Dv]
        x = torch.cat([emb.class_embedding.to(x)[None], x])  # [1 + k, Dv]
        x = x + torch.cat([emb.position_embedding.weight[:1], self.position_at(at.to(weight.device))]).to(x)
        layers = self.visual.encoder.layers
        wanted = [self.feature_layer] if isinstance(self.feature_layer, int) else list(self.feature_layer)
        wanted = [i % (len(layers) + 1) for i in wanted]  # hidden state 0 is the encoder's input
        states = [self.visual.pre_layrnorm(x[None])]
        for layer in layers[:max(wanted)]:
            states.append(layer(states[-1], None))
        return self.projector(torch.cat([states[i] for i in wanted], -1)[0, 1:])

    # ------------------------------------------------------------------ visual tokens
    @torch.no_grad()
    def encode(self, images: Sequence[Tensor], cells: Sequence[Tensor | None], *, mode: str = "sparse",
               gestalt: Sequence[Any] | None = None, layout: str = "scaled",
               weights: Sequence[Tensor | None] | None = None,
               encoded: Sequence[VisualTokens | None] | None = None) -> list[VisualTokens]:
        """Gestalt + saccade tokens per image.

        Args:
            images: each [3, H, W] in [0, 1], H and W multiples of ``cell`` (14 px).
            cells: each [K, 2] (y, x) chosen cells in relevance order; empty or None for a gestalt
                alone (ignored by ``weighted``).
            mode: ``sparse`` encodes only the chosen patches of each tile; ``slice`` encodes every
                tile holding a chosen cell and keeps the chosen tokens; ``weighted`` keeps every cell,
                scaled by ``weights`` [Hc, Wc].
            gestalt: per image, any non-None value sends LLaVA's own S x S encoding first (its grid
                is fixed by the tower), None sends none.
            layout: ``scaled`` only: a 1-D RoPE has one layout, tokens in sequence.
            encoded: must be None: LLaVA has no first look whose gestalt it could reuse.
        """
        check_options(mode)
        self.check_layout(layout)
        self.refuse_encoded(encoded)
        cells, gestalt, weights = per_image(len(images), cells=cells, gestalt=gestalt, weights=weights)
        batch: list[Tensor] = []  # S x S inputs of one native tower call, shared by every image
        plans = []
        for img, chosen, g, w in zip(images, cells, gestalt, weights):
            grid = image_grid(img, self.cell)
            x = self.normalize(img)
            chosen = mode_cells(mode, chosen, w, grid, x.device, allow_empty=True)
            if len(chosen) == 0 and g is None:
                raise ValueError("nothing to encode: give cells, a gestalt, or both, for each image")
            tile, at = box_places(F.pad(chosen, (0, 1), value=1), self.side, grid)  # cells are size-1 boxes
            plan = Plan(tile=tile, inner=(at[:, 0] * self.side + at[:, 1]).long(),
                        weights=w if mode == "weighted" else None)
            self.add_gestalt(plan, img, g, batch)
            if mode == "sparse":
                c = self.cell
                patches = x.reshape(3, grid[0], c, grid[1], c).permute(1, 3, 0, 2, 4)[chosen[:, 0], chosen[:, 1]]
                plan.tokens = self.sparse_tokens(patches, at, plan)  # patches: [K, 3, P, P]
                plans.append(plan)
                continue
            tiles, used = to_tiles(x, self.size), torch.unique(plan.tile)
            if len(used):
                used = torch.arange(len(tiles), device=x.device) if mode == "weighted" else used
                plan.tiles = (len(batch), used)
                batch.extend(tiles[used])
                plan.segments += [self.side ** 2 + 1] * len(used)
            plans.append(plan)
        feats = self.tile_features(torch.stack(batch)) if batch else None
        return [self.collect(p, feats) for p in plans]

    @torch.no_grad()
    def encode_patches(self, images: Sequence[Tensor], boxes: Sequence[Tensor], *,
                       gestalt: Sequence[Any] | None = None, layout: str = "scaled",
                       encoded: Sequence[VisualTokens | None] | None = None) -> list[VisualTokens]:
        """Variable-size patches (``arr_coc.allocators.patching``): each square shrunk to one token at its centre.

        Each (y, x, size) square of cells is resized to one 14 px cell (bilinear, antialiased; a
        size-1 box is its cell's pixels untouched) and encoded like a sparse saccade: with the other
        squares of its tile, CLS in front, at the position embedding read bilinearly at its centre.
        The tile is the one holding the centre, and a centre past the last slot of that tile is
        clamped to it (see :func:`box_places`), so a square straddling tiles is placed at most half a
        cell off. Size-1 boxes at cells give exactly ``encode(images, cells, mode="sparse")``.

        Args:
            images: each [3, H, W] in [0, 1], sides multiples of ``cell``.
            boxes: each a non-empty [K, 3] (y, x, size) in cells, in the order the tokens are sent;
                drop the size-0 padding rows of ``Patches.boxes`` first (keep ``counts[b]`` rows).
            gestalt, layout, encoded: as in :meth:`encode` (LLaVA's own S x S view first for any non-None
                gestalt; one 1-D layout, tokens in sequence; nothing encoded to reuse).
        """
        self.check_layout(layout)
        self.refuse_encoded(encoded)
        boxes, gestalt = per_image(len(images), boxes=boxes, gestalt=gestalt)
        batch: list[Tensor] = []
        plans = []
        for img, bx, g in zip(images, boxes, gestalt):
            grid = image_grid(img, self.cell)
            img = img.float().to(self.visual.device)
            bx = check_boxes(bx, grid, img.device)
            crops = shrink_squares(img, bx, self.cell)  # [K, 3, P, P]
            tile, at = box_places(bx, self.side, grid)
            plan = Plan(tile=tile)
            self.add_gestalt(plan, img, g, batch)
            plan.tokens = self.sparse_tokens(self.normalize(crops), at, plan)
            plans.append(plan)
        feats = self.tile_features(torch.stack(batch)) if batch else None
        return [self.collect(p, feats) for p in plans]

    def refuse_encoded(self, encoded: Sequence[VisualTokens | None] | None) -> None:
        """LLaVA encodes its gestalt with the tiles: an already encoded one cannot be reused."""
        if encoded is not None and any(e is not None for e in encoded):
            self.require(FIRST_LOOK, "reusing an encoded gestalt")

    def add_gestalt(self, plan: Plan, image: Tensor, gestalt: Any, batch: list[Tensor]) -> None:
        """Queue LLaVA's own S x S view of ``image`` [3, H, W] in the shared tower batch unless gestalt is None."""
        if gestalt is None:
            return
        plan.gestalt = len(batch)
        batch.append(self.normalize(self.gestalt_image(image)))
        plan.segments.append(self.side ** 2 + 1)  # + CLS

    def sparse_tokens(self, patches: Tensor, at: Tensor, plan: Plan) -> Tensor | None:
        """Saccade tokens [K, D] in the plan's order from normalised patches [K, C, P, P] at in-tile slots
        ``at`` [K, 2]: one tower call per tile, over CLS + that tile's patches; None when K = 0."""
        tokens = None
        for t in torch.unique(plan.tile).tolist():
            here = plan.tile == t
            out = self.tower_tokens(patches[here], at[here])
            if tokens is None:
                tokens = out.new_zeros(len(plan.tile), out.shape[1])
            tokens[here] = out
            plan.segments.append(int(here.sum()) + 1)  # + CLS
        return tokens

    def collect(self, plan: Plan, feats: Tensor | None) -> VisualTokens:
        """One image's tokens from its plan and the batched native tile features [T, native_tokens, D]."""
        parts = [] if plan.gestalt is None else [feats[plan.gestalt]]
        if plan.tokens is not None:
            parts.append(plan.tokens)
        elif plan.tiles is not None:
            start, used = plan.tiles
            slot = torch.searchsorted(used, plan.tile) + start  # `used` is sorted
            extra = self.native_tokens - self.side ** 2  # CLS ahead of the patches under "full"
            tokens = feats[slot, extra + plan.inner]
            parts.append(tokens if plan.weights is None else tokens * plan.weights.to(tokens).reshape(-1, 1))
        embeds = torch.cat(parts)
        positions = torch.arange(len(embeds), device=embeds.device, dtype=torch.float32)[None]
        n_gestalt = 0 if plan.gestalt is None else len(parts[0])
        return VisualTokens(embeds, positions, n_gestalt, [], tuple(plan.segments))

    def encode_native(self, images: Sequence[Tensor]) -> list[VisualTokens]:
        """LLaVA's own encoding of each image (its S x S view): what the model sees without arr-coc."""
        return self.encode(images, [None] * len(images), mode="slice", gestalt=[True] * len(images))

    # ------------------------------------------------------------------ language model
    def prompt_segments(self, question: str, images: int = 1) -> list[list[int]]:
        """Chat-templated prompt around ``images`` ``<image>`` placeholders (LLaVA's multi-image convention:
        one each, in order) -> the images + 1 runs of ids between them."""
        ids = chat_ids(self.tokenizer, self.processor, question, self.image_token_id, images=images)
        bos = getattr(self.tokenizer, "bos_token_id", None)
        if bos is not None and (not ids or ids[0] != bos):  # LLaVA's processor adds BOS the template lacks
            ids = [bos] + ids
        return split_at_images(ids, self.image_token_id, images)

    def language_model(self, x: dict) -> Tensor:
        """Final hidden states [B, L, D] for ``inputs_embeds``, mask, [1, B, L] positions and cache."""
        pos = x["position_ids"]
        if pos.ndim == 3:  # [1, B, L] from assemble/generate
            pos = pos[0]
        ids = pos.round().long()
        if not torch.equal(ids.to(pos.dtype), pos):
            raise ValueError("LLaVA's 1-D RoPE takes whole-number positions")
        out = self.lm(inputs_embeds=x["inputs_embeds"], attention_mask=x["attention_mask"], position_ids=ids,
                      cache=x.get("past_key_values"), use_cache=x.get("past_key_values") is not None)
        return out.last_hidden_state

    def native_inputs(self, images: Sequence[Tensor | Sequence[Tensor]], questions: Sequence[str]) -> dict[str, Tensor]:
        """Inputs for the model's own forward (placeholders expanded, S x S pixels): the reference.

        ``images[b]``: one image, or the pages of prompt b, each its own ``<image>`` expanded to the
        tower's tokens, their pixels stacked in prompt order (LLaVA's multi-image convention).
        """
        ids, pixels = [], []
        for pages, q in zip(images, questions):
            pages = [pages] if isinstance(pages, Tensor) else list(pages)
            runs = self.prompt_segments(q, len(pages))
            row = list(runs[0])
            for img, run in zip(pages, runs[1:]):
                row += [self.image_token_id] * self.native_tokens + list(run)
                pixels.append(self.normalize(self.gestalt_image(img)))
            ids.append(row)
        input_ids, mask = left_pad(ids, self.text_config.pad_token_id or 0)
        # positions count real tokens only, exactly as assemble() lays them out
        return {"input_ids": input_ids, "attention_mask": mask, "pixel_values": torch.stack(pixels),
                "position_ids": (mask.cumsum(1) - 1).clamp_min(0)}

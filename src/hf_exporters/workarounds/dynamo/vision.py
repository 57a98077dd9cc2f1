"""Vision towers that read their images' sizes from data: model patches (DynamoExporter Stage 2,
applied for every backend).

Pattern: a tower packs the patches of several images (or frames) into one sequence and derives
per-image indices from the grid (``grid_thw``, image sizes, OCR boxes) with Python ints and loops:
``for t, h, w in grid_thw.tolist()``, ``int(h)``, per-image lists, ragged rows. The trace stops on a
data-dependent size, or the loop fixes the number of images. The patches compute the same window
orders, position ids, gather indices and merged rows for every image at once with tensor ops, the
sizes kept as symbols (:func:`~hf_exporters.workarounds._packing.packed_positions` maps each packed
item to its image).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ...registry import register_patch
from .._packing import packed_positions


@register_patch(
    "dynamo",
    "transformers.models.cosmos3_edge.modeling_cosmos3_edge.Cosmos3EdgeVisionEmbeddings.resize_positional_embeddings",
    loaded_only=True,
)
def _patch_cosmos3_edge_grid_sides_checked(original: Any) -> Any:
    """Cosmos3 Edge's per-image position-grid resize, with each image's grid sides stated to be whole
    multiples of the merge size.

    Pattern: ``for t, h, w in grid_thw.tolist()`` resizes the learned grid to ``(h, w)`` and then views it
    as ``(h // m, m, w // m, m, -1)`` blocks (``m = spatial_merge_size``). With ``h``, ``w`` read from the
    data, the trace stops on the resize's size checks ("Could not guard on data-dependent expression
    u1 > 0") and then on the ``-1`` of the block view. The image processor makes every side a positive
    multiple of ``m`` (the projector merges ``m x m`` patches); ``torch._check`` states that (and
    ``t >= 0``) before the same resize, block reorder and repeat over frames, image after image. A grid
    that breaks it fails with a message naming the side, where eager may still reshape it. Positions
    are unchanged: (sum of t*h*w, hidden) in the patches' order.
    Models: Cosmos3EdgeVisionModel.
    Upstream: transformers models/cosmos3_edge/modeling_cosmos3_edge.py
        (``Cosmos3EdgeVisionEmbeddings.resize_positional_embeddings``); pytorch/pytorch#125180
    Remove when: the model checks the grid with ``torch_compilable_check`` before the resize.
    """
    import torch.nn.functional as F  # noqa: N812 - torch's usual alias

    def resize_positional_embeddings(positional_embeddings: torch.Tensor, grid_thw: torch.Tensor, spatial_merge_size: int) -> torch.Tensor:
        # positional_embeddings (side, side, hidden) -> (1, hidden, side, side), resized in float32 (CPU antialias)
        grid = positional_embeddings.permute(2, 0, 1).unsqueeze(0)
        dtype = grid.dtype
        if grid.device.type == "cpu":
            grid = grid.float()
        m = spatial_merge_size
        pieces = []
        for frames, rows, cols in grid_thw.tolist():
            torch._check(frames >= 0, lambda: "grid_thw: a negative frame count")
            for side in (rows, cols):
                torch._check(side >= m, lambda: f"grid_thw: a grid side below the merge size {m}")
                torch._check(side % m == 0, lambda: f"grid_thw: a grid side that is not a multiple of the merge size {m}")
            plane = F.interpolate(grid, size=(rows, cols), mode="bilinear", align_corners=False, antialias=True)
            plane = plane[0].permute(1, 2, 0).to(dtype)  # (rows, cols, hidden)
            blocks = plane.reshape(rows // m, m, cols // m, m, plane.shape[-1]).transpose(1, 2)
            pieces.append(blocks.reshape(rows * cols, plane.shape[-1]).repeat(frames, 1))
        return torch.cat(pieces, dim=0)

    return staticmethod(resize_positional_embeddings)


#: modeling modules (transformers 5.23) that import ``get_vision_window_index`` by name
_WINDOW_INDEX_USERS = ("exaone4_5", "minicpm_ocr", "minicpmv4_6", "minicpmv4_7", "muse_glimmer", "muse_spark", "qwen2_5_omni", "qwen2_5_vl")


#: modeling modules (transformers 5.23) that import ``get_vision_nearest_position_ids`` by name
_NEAREST_POSITION_USERS = ("minicpm_ocr", "minicpmv4_6", "minicpmv4_7")


def _window_index_by_sort(grid_thw: torch.Tensor, spatial_merge_size: int, window_size: int, patch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Window order of the merged tokens of every image and the windows' cumulative patch counts.

    ``grid_thw`` (images, 3): ``(t, h, w)`` in patches. A frame of ``h / m`` x ``w / m`` merged tokens
    (``m = spatial_merge_size``) is cut into windows of ``k = window_size / m / patch_size`` tokens a
    side, the last row and column of windows cut short. Each token gets the key (image, frame, window
    row, window column, row in window, column in window); ``argsort`` of the keys is the window order.
    Returns ``window_index`` (total merged tokens,) int64 and ``cu_window_seqlens`` (windows + 1,)
    int32 in patches (``m * m`` per token), windows frame by frame and image after image, with no empty
    window: the values ``get_vision_window_index`` returns. Every image is handled at once, so neither
    the number of images nor their sizes become Python ints.
    """
    side = window_size // spatial_merge_size // patch_size
    grid = grid_thw.long()
    frames, rows, cols = grid[:, 0], grid[:, 1] // spatial_merge_size, grid[:, 2] // spatial_merge_size
    window_rows, window_cols = (rows + side - 1) // side, (cols + side - 1) // side

    image, token = packed_positions(frames * rows * cols)
    rows_of, cols_of, window_rows_of, window_cols_of = rows[image], cols[image], window_rows[image], window_cols[image]
    frame, row, col = token // (rows_of * cols_of), (token // cols_of) % rows_of, token % cols_of
    window_of = (frame * window_rows_of + row // side) * window_cols_of + col // side
    windows_before = torch.cumsum(frames * window_rows * window_cols, 0) - frames * window_rows * window_cols
    key = ((windows_before[image] + window_of) * side + row % side) * side + col % side
    window_index = torch.argsort(key)

    image, window = packed_positions(frames * window_rows * window_cols)
    window_rows_of, window_cols_of = window_rows[image], window_cols[image]
    height_in = torch.clamp(rows[image] - (window // window_cols_of) % window_rows_of * side, max=side)
    width_in = torch.clamp(cols[image] - window % window_cols_of * side, max=side)
    lengths = height_in * width_in * spatial_merge_size**2
    cu_window_seqlens = torch.cat([torch.zeros(1, dtype=torch.long, device=grid.device), torch.cumsum(lengths, 0)])
    return window_index, cu_window_seqlens.to(torch.int32)


@register_patch(
    "dynamo",
    "transformers.vision_utils.get_vision_window_index",
    *(f"transformers.models.{package}.modeling_{package}.get_vision_window_index" for package in _WINDOW_INDEX_USERS),
    loaded_only=True,
)
def _patch_vision_window_index_by_sort(original: Any) -> Any:
    """Compute the window-attention order of vision tokens with tensor ops on symbolic sizes.

    Pattern: ``get_vision_window_index(grid_thw, ...)`` turns each image's grid into Python ints
    (``int(grid_t)``), pads an index grid to whole windows, keeps the non-padded entries with a boolean
    mask and drops empty windows with ``unique_consecutive``. The grid is data, so the trace fails with
    "Could not extract specialized integer from data-dependent expression" in static exports too.
    :func:`_window_index_by_sort` gives the same two tensors from sizes kept as symbols: the order by
    ``argsort`` of a per-token key, the window lengths from each window's clipped height and width.
    Precomputed ``window_index``/``cu_window_seqlens`` in ``kwargs`` are still popped and returned.
    Models: Qwen2.5-VL and Qwen2.5-Omni vision towers, Exaone 4.5, Muse Glimmer, Muse Spark,
    MiniCPM-OCR, MiniCPM-V 4.6/4.7 vision towers.
    Upstream: transformers ``vision_utils.get_vision_window_index`` (its docstring asks exporters to
        pass the tensors precomputed; no report found)
    Remove when: transformers computes the window index without Python ints or ``unique_consecutive``.
    """

    def get_vision_window_index(grid_thw: torch.Tensor, spatial_merge_size: int, window_size: int, patch_size: int, kwargs: dict | None = None) -> Any:
        if kwargs is not None and kwargs.get("window_index") is not None and kwargs.get("cu_window_seqlens") is not None:
            return original(grid_thw, spatial_merge_size, window_size, patch_size, kwargs=kwargs)
        if kwargs is not None:  # one precomputed without the other: popped and unused, as the original does
            kwargs.pop("window_index", None), kwargs.pop("cu_window_seqlens", None)
        return _window_index_by_sort(grid_thw, spatial_merge_size, window_size, patch_size)

    return functools.wraps(original)(get_vision_window_index)


@register_patch(
    "dynamo",
    "transformers.vision_utils.get_vision_nearest_position_ids",
    *(f"transformers.models.{package}.modeling_{package}.get_vision_nearest_position_ids" for package in _NEAREST_POSITION_USERS),
    loaded_only=True,
)
def _patch_vision_nearest_position_ids_symbolic(original: Any) -> Any:
    """Bucket each image's patch rows and columns with its size kept as a symbol.

    Pattern: ``get_vision_nearest_position_ids(target_sizes, n)`` reads each ``(h, w)`` with
    ``int(height), int(width)``; the sizes are data, so the trace fails with "Could not extract
    specialized integer from data-dependent expression u0". The replacement buckets every patch of
    every image at once (row ``r`` of an image of height ``h`` falls in bucket ``bucketize(r / h)``, the
    same for columns), giving the same (sum of h * w,) int64 ids into the ``n * n`` position table
    without turning the number of images or their sizes into Python ints. A precomputed ``position_ids`` in
    ``kwargs`` is still popped and returned.
    Models: MiniCPM-OCR and MiniCPM-V 4.6/4.7 vision towers.
    Upstream: transformers ``vision_utils.get_vision_nearest_position_ids`` (no report found)
    Remove when: transformers drops the ``int()`` conversions.
    """

    def get_vision_nearest_position_ids(target_sizes: torch.Tensor, num_patches_per_side: int, kwargs: dict | None = None) -> torch.Tensor:
        if kwargs is not None and kwargs.get("position_ids") is not None:
            return original(target_sizes, num_patches_per_side, kwargs=kwargs)
        boundaries = torch.arange(1 / num_patches_per_side, 1.0, 1 / num_patches_per_side, device=target_sizes.device)
        sizes = target_sizes.long()
        image, patch = packed_positions(sizes[:, 0] * sizes[:, 1])
        height, width = sizes[image, 0], sizes[image, 1]
        rows = torch.bucketize((patch // width) / height, boundaries, right=True)
        cols = torch.bucketize((patch % width) / width, boundaries, right=True)
        return rows * num_patches_per_side + cols

    return functools.wraps(original)(get_vision_nearest_position_ids)


def _pixel_shuffle_index(grid_thw: torch.Tensor, merge_size: int) -> torch.Tensor:
    """Gather index that puts each ``m x m`` block of patches (``m = merge_size``) of every frame on
    ``m * m`` consecutive rows, frame after frame and image after image.

    ``grid_thw`` (images, 3): ``(t, h, w)`` in patches, ``h`` and ``w`` multiples of ``m``. Output
    position ``q`` of a frame is (block row, block column, row in block, column in block) in row-major
    order over ``(h/m, w/m, m, m)``; it reads the frame's patch ``(block row * m + row) * w + block
    column * m + column``. Returns (sum of t * h * w,) int64, every image at once.
    """
    grid = grid_thw.long()
    counts = grid[:, 0] * grid[:, 1] * grid[:, 2]
    image, item = packed_positions(counts)  # item: the place within its image
    height, width = grid[image, 1], grid[image, 2]
    q = item % (height * width)
    blocks_w = width // merge_size
    block, inside = q // (merge_size * merge_size), q % (merge_size * merge_size)
    row = (block // blocks_w) * merge_size + inside // merge_size
    col = (block % blocks_w) * merge_size + inside % merge_size
    image_start = (torch.cumsum(counts, 0) - counts)[image]
    return image_start + (item - q) + row * width + col


@register_patch(
    "dynamo",
    *(f"transformers.models.{package}.modeling_{package}.get_vision_pixel_shuffle_index" for package in ("muse_glimmer", "muse_spark")),
    loaded_only=True,
)
def _patch_vision_pixel_shuffle_index_symbolic(original: Any) -> Any:
    """Compute the pixel-shuffle gather index of vision tokens with the grid kept as symbols.

    Pattern: ``get_vision_pixel_shuffle_index(grid_thw, merge_size)`` loops over ``grid_thw.tolist()``
    and reads each image's ``int(frames), int(height), int(width)``; the grid is data, so the trace
    fails with "Could not extract specialized integer from data-dependent expression" in static exports
    too. :func:`_pixel_shuffle_index` gives the same (sum of t * h * w,) int64 index for every image at
    once. A precomputed ``pixel_shuffle_index`` in ``kwargs`` is still popped and returned.
    Models: MuseGlimmerVisionModel, MuseSparkVisionModel (and the models around them).
    Upstream: transformers ``get_vision_pixel_shuffle_index`` of muse_glimmer and muse_spark (its
        docstring asks exporters to pass the index precomputed; no report found)
    Remove when: transformers computes the index without Python ints.
    """

    def get_vision_pixel_shuffle_index(grid_thw: torch.Tensor, merge_size: int, kwargs: dict | None = None) -> torch.Tensor:
        if kwargs is not None and kwargs.get("pixel_shuffle_index") is not None:
            return original(grid_thw, merge_size, kwargs=kwargs)
        return _pixel_shuffle_index(grid_thw, merge_size)

    return functools.wraps(original)(get_vision_pixel_shuffle_index)


@register_patch("dynamo", "transformers.models.udop.modeling_udop.combine_image_text_embeddings", loaded_only=True)
def _patch_udop_combine_without_ragged_rows(original: Any) -> Any:
    """UDOP's image/text merge with fixed-size rows: the image patches no OCR box points at, moved to
    the front of each row in their order, then zeros, instead of a ragged list per row padded back.

    Pattern: ``patch_inds[rows, cols] = False`` with ``rows, cols = zip(*ind)`` iterates a tensor in
    Python, then ``image_embeddings[i][patch_inds[i]]`` keeps a data-dependent count per row before
    ``pad_sequence`` pads it to the patch count. The trace stopped on the iteration ("The tensor has a
    non-zero number of elements, but its data is not allocated yet"). Here the mask comes from one
    ``scatter``, each kept patch is scattered to its rank among the kept ones (a cumulative sum), and
    the rest stays zero: the same rows, bounding boxes and attention mask as the loop for the padded
    length the model uses (``max_len=0``: the patch count), with no sort (which ONNX and ExecuTorch
    lack in its stable form). Other ``max_len`` values call the original.
    Models: UdopModel, UdopForConditionalGeneration, UdopEncoderModel.
    Upstream: transformers models/udop/modeling_udop.py (``combine_image_text_embeddings``);
        pytorch/pytorch#125180 (data-dependent sizes under export)
    Remove when: UDOP builds the merged rows without Python iteration over tensors.
    """

    def combine_image_text_embeddings(
        image_embeddings: torch.Tensor,
        inputs_embeds: torch.Tensor,
        bbox: torch.Tensor,
        visual_bbox: torch.Tensor | None,
        attention_mask: torch.Tensor | None = None,
        num_patches: int = 14,
        max_len: int = 0,
        image_size: int = 224,
        patch_size: int = 16,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if max_len != 0:
            return original(image_embeddings, inputs_embeds, bbox, visual_bbox, attention_mask, num_patches, max_len, image_size, patch_size)
        from transformers.models.udop.modeling_udop import get_visual_bbox

        # image_embeddings (batch, patches, hidden); inputs_embeds (batch, tokens, hidden); bbox (batch, tokens, 4)
        batch, patches = image_embeddings.shape[:2]
        side = num_patches
        centre_x = torch.clip(torch.floor((bbox[:, :, 0] + bbox[:, :, 2]) / 2.0 * side).long(), 0, side - 1)
        centre_y = torch.clip(torch.floor((bbox[:, :, 1] + bbox[:, :, 3]) / 2.0 * side).long(), 0, side - 1) * side
        ocr_points = centre_x + centre_y  # (batch, tokens): the patch each token's box centre falls in
        wide = bbox.to(torch.float64)
        target_seg = (wide.mean(-1) == 0.0) | (wide.mean(-1) == 1.0)
        repeated = torch.gather(image_embeddings, 1, ocr_points.unsqueeze(-1).expand(-1, -1, image_embeddings.size(-1)))
        inputs_embeds = inputs_embeds + repeated.masked_fill(target_seg[..., None], 0.0)

        kept = torch.ones(batch, patches, dtype=torch.bool, device=image_embeddings.device).scatter(1, ocr_points, False)
        # each kept patch goes to its rank among the kept ones; the others to a spare slot, cut off after
        dest = torch.where(kept, kept.cumsum(dim=1) - 1, patches)[..., None]
        valid = torch.arange(patches, device=kept.device)[None, :] < kept.sum(dim=1, keepdim=True)

        def compact(rows: torch.Tensor) -> torch.Tensor:
            spare = rows.new_zeros(batch, patches + 1, rows.size(-1))
            return spare.scatter(1, dest.expand(-1, -1, rows.size(-1)), rows)[:, :patches]

        vision = compact(image_embeddings)
        if visual_bbox is None:
            visual_bbox = get_visual_bbox(image_size=image_size, patch_size=patch_size)
            visual_bbox = visual_bbox.unsqueeze(0).repeat(batch, 1, 1).to(image_embeddings.device)
        boxes = compact(visual_bbox)

        inputs_embeds = torch.cat([inputs_embeds, vision], 1)
        bbox = torch.cat([wide, boxes.to(wide.dtype)], 1)  # float64, as the original returns
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, valid.to(attention_mask.dtype)], 1)
        return inputs_embeds, bbox, attention_mask

    return combine_image_text_embeddings


@register_patch("dynamo", "transformers.models.pixtral.modeling_pixtral.PixtralVisionModel.forward", loaded_only=True)
def _patch_pixtral_same_size_images_batched(original: Any) -> Any:
    """Pixtral's vision encoder on a batch of full-size images (no ``image_sizes``), packed without
    per-image Python lists.

    Pattern: without ``image_sizes`` the forward builds ``[(height, width)] * batch_size`` and then
    walks the images in Python (crop each patch grid, flatten, positions per image, a block mask
    filled block by block), which fixes the batch size (``Eq(s99, 2)``). When every image is the
    full size each grid is the whole convolution output, so the patch packs the grids with one
    reshape, (batch * h * w, hidden), repeats one grid's (row, column) positions per image and
    builds the block-diagonal mask from each token's image index: the same sequence, positions and
    mask. Calls with ``image_sizes`` (images of different sizes) or flash attention keep the
    method's body; the method's decorators (config defaults, output capturing) wrap both.
    Models: PixtralVisionModel (dynamic batch).
    Upstream: transformers models/pixtral/modeling_pixtral.py (``PixtralVisionModel.forward``); no report found
    Remove when: the encoder packs same-size images without Python lists over the batch.
    """
    import inspect

    from transformers.utils.generic import is_flash_attention_requested, merge_with_config_defaults
    from transformers.utils.output_capturing import capture_outputs

    body = inspect.unwrap(original)
    if getattr(getattr(original, "__wrapped__", None), "__wrapped__", None) is not body:
        return original  # not the two decorators this patch rebuilds: the method as it is

    def forward(self: Any, pixel_values: torch.Tensor, image_sizes: torch.Tensor | None = None, **kwargs: Any) -> Any:
        if image_sizes is not None or is_flash_attention_requested(self.config):
            return body(self, pixel_values, image_sizes, **kwargs)
        patch_embeds = self.patch_conv(pixel_values.to(dtype=self.patch_conv.weight.dtype))  # (batch, hidden, h, w)
        batch, hidden, rows, columns = patch_embeds.shape
        per_image = rows * columns
        packed = self.ln_pre(patch_embeds.flatten(2).transpose(1, 2).reshape(1, batch * per_image, hidden))
        row_ids, column_ids = torch.meshgrid(
            torch.arange(rows, device=packed.device), torch.arange(columns, device=packed.device), indexing="ij"
        )
        grid = torch.stack([row_ids.flatten(), column_ids.flatten()], dim=-1)  # (h * w, 2)
        position_embeddings = self.patch_positional_embedding(packed, grid.repeat(batch, 1))
        image = torch.arange(batch * per_image, device=packed.device) // per_image
        same_image = image[:, None] == image[None, :]
        blocked = torch.full((), torch.finfo(packed.dtype).min, dtype=packed.dtype, device=packed.device)
        attention_mask = torch.where(same_image, torch.zeros((), dtype=packed.dtype, device=packed.device), blocked)
        return self.transformer(packed, attention_mask=attention_mask[None, None], position_embeddings=position_embeddings, **kwargs)

    forward.__name__, forward.__qualname__, forward.__doc__ = body.__name__, body.__qualname__, body.__doc__
    return merge_with_config_defaults(capture_outputs(forward))


@register_patch("dynamo", "transformers.models.kimi_k25.modeling_kimi_k25.get_vision_frame_index", loaded_only=True)
def _patch_kimi_frame_index_symbolic(original: Any) -> Any:
    """Kimi-K2.5's per-patch frame index computed for every clip at once, the grid kept as symbols.

    Pattern: ``for t, h, w in grid_thw.tolist(): t, h, w = int(t), int(h), int(w)``; the grid is data,
    so ``int()`` stops the trace ("Could not extract specialized integer from data-dependent
    expression u4") in static exports too. Patch ``p`` of a clip of ``t`` frames of ``h x w`` patches
    is in frame ``p // (h * w)``; the index is that frame + 1 for a clip of more than one frame and 0
    for an image: the same (sum of t * h * w,) int64 index. A precomputed ``frame_index`` in
    ``kwargs`` is still popped and returned.
    Models: Kimi_K25VisionModel (and the models around it).
    Upstream: transformers models/kimi_k25/modeling_kimi_k25.py (``get_vision_frame_index``; its
        docstring asks exporters to pass the index precomputed); no report found
    Remove when: transformers computes the index without Python ints.
    """

    def get_vision_frame_index(grid_thw: torch.Tensor, kwargs: dict | None = None) -> torch.Tensor:
        if kwargs is not None and kwargs.get("frame_index") is not None:
            return original(grid_thw, kwargs=kwargs)
        grid = grid_thw.long()
        image, item = packed_positions(grid[:, 0] * grid[:, 1] * grid[:, 2])
        frames = grid[image, 0]
        return item // (grid[image, 1] * grid[image, 2]) + (frames > 1).long()

    return functools.wraps(original)(get_vision_frame_index)


@register_patch("dynamo", "transformers.models.kimi_k25.modeling_kimi_k25.get_vision_temporal_merge_index", loaded_only=True)
def _patch_kimi_temporal_merge_index_symbolic(original: Any) -> Any:
    """Kimi-K2.5's temporal-pooling gather index computed for every clip at once, the grid kept as symbols.

    Pattern: ``for t, h, w in grid_thw.tolist(): t, h, w = int(t), int(h), int(w)`` builds, clip by
    clip, the ``(merged tokens, t, kh * kw)`` index of the patches each merged token pools; ``int()``
    of data stops the trace. The clips of one call share ``t`` (the model concatenates their rows), so
    the patch reads ``t`` once, checks at run time that every clip has it, and gives merged token
    ``(block row, block column)`` of a clip, frame ``f`` and kernel cell ``(i, j)`` the patch
    ``clip start + f * h * w + (block row * kh + i) * w + block column * kw + j``: the same int64
    index. A precomputed ``temporal_merge_index`` in ``kwargs`` is still popped and returned.
    Models: Kimi_K25VisionModel (and the models around it).
    Upstream: transformers models/kimi_k25/modeling_kimi_k25.py (``get_vision_temporal_merge_index``);
        no report found
    Remove when: transformers computes the index without Python ints.
    """

    def get_vision_temporal_merge_index(grid_thw: torch.Tensor, kernel_height: int, kernel_width: int, kwargs: dict | None = None) -> torch.Tensor:
        if kwargs is not None and kwargs.get("temporal_merge_index") is not None:
            return original(grid_thw, kernel_height, kernel_width, kwargs=kwargs)
        grid = grid_thw.long()
        frames = grid[0, 0].item()
        torch._check(frames >= 1)
        torch._check((grid[:, 0] == frames).all().item(), lambda: "grid_thw: clips with different frame counts")
        heights, widths = grid[:, 1], grid[:, 2]
        blocks_w = widths // kernel_width
        image, token = packed_positions((heights // kernel_height) * blocks_w)  # merged tokens
        cells = kernel_height * kernel_width
        # one flat position per (merged token, frame, kernel cell), decoded without broadcasting
        # between data-dependent sizes
        flat = torch.arange(token.shape[0] * frames * cells, device=grid.device)
        merged, frame, cell = flat // (frames * cells), (flat // cells) % frames, flat % cells
        image, token = image[merged], token[merged]
        width = widths[image]
        row = (token // blocks_w[image]) * kernel_height + cell // kernel_width
        col = (token % blocks_w[image]) * kernel_width + cell % kernel_width
        counts = grid[:, 0] * heights * widths
        start = (torch.cumsum(counts, 0) - counts)[image]
        index = start + frame * (heights * widths)[image] + row * width + col
        return index.view(-1, frames, cells)

    return functools.wraps(original)(get_vision_temporal_merge_index)


def _merge_block_coordinates(grid: torch.Tensor, merge: torch.Tensor, image: torch.Tensor, item: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) in its frame of each patch laid out block-major: frame after frame, ``m x m``
    merge blocks in row-major order (``m = merge[image]``), the block's patches row-major inside it.

    ``grid`` (images, 3) int64 ``(t, h, w)``; ``image`` and ``item`` (patches,): each patch's image
    and place within it (:func:`packed_positions`). Returns two (patches,) int64 tensors."""
    width = grid[image, 2]
    m = merge[image]
    q = item % (grid[image, 1] * width)  # place within the frame
    blocks_w = width // m
    block, inside = q // (m * m), q % (m * m)
    return (block // blocks_w) * m + inside // m, (block % blocks_w) * m + inside % m


@register_patch("dynamo", "transformers.vision_utils.get_vision_position_ids", "transformers.models.*.modeling_*.get_vision_position_ids")
def _patch_vision_position_ids_symbolic(original: Any) -> Any:
    """Rotary position ids of packed vision patches computed for every image at once, the number of
    images and their grids kept as symbols.

    Pattern: ``get_vision_position_ids(grid_thw, merge)`` loops over ``zip(grid_thw.tolist(),
    merge.tolist())`` and builds each image's ids with ``meshgrid``; the Python loop fixes the number
    of images (a dynamic ``grid_thw`` axis 0 ends static, "You marked n as dynamic but your code
    specialized it to be a constant (2)"). Each patch's (row, column) in block-major order comes from
    its place in its image (:func:`_merge_block_coordinates`), with the frame index in front when
    ``include_temporal``: the same (sum of t * h * w, 2 or 3) int64 ids. A precomputed
    ``position_ids`` in ``kwargs`` is still popped and returned.
    Models: the Qwen2-VL family and the vision towers that share transformers' helper (Qwen2.5/3/3.5-VL,
        GLM-4V, GLM-OCR, GLM-Image, HunYuan-VL, LFM3-VL, PaddleOCR-VL, MiniMax-M3-VL, Kimi-K2.5,
        VideoLLaMA3, ...).
    Upstream: transformers ``vision_utils.get_vision_position_ids`` (its docstring asks exporters to
        pass the ids precomputed); no report found
    Remove when: transformers computes the ids without a Python loop over the images.
    """

    def get_vision_position_ids(grid_thw: torch.Tensor, spatial_merge_size: Any, include_temporal: bool = False, kwargs: dict | None = None) -> torch.Tensor:
        if kwargs is not None and kwargs.get("position_ids") is not None:
            return original(grid_thw, spatial_merge_size, include_temporal=include_temporal, kwargs=kwargs)
        grid = grid_thw.long()
        if isinstance(spatial_merge_size, int):
            merge = torch.full_like(grid[:, 0], spatial_merge_size)
        else:
            merge = torch.as_tensor(spatial_merge_size, device=grid.device).long().reshape(-1).expand(grid.shape[0])
        image, item = packed_positions(grid[:, 0] * grid[:, 1] * grid[:, 2])
        row, col = _merge_block_coordinates(grid, merge, image, item)
        if include_temporal:
            return torch.stack([item // (grid[image, 1] * grid[image, 2]), row, col], dim=-1)
        return torch.stack([row, col], dim=-1)

    return functools.wraps(original)(get_vision_position_ids)


@register_patch("dynamo", "transformers.models.video_llama_3.modeling_video_llama_3.VideoLlama3VisionModel.pixel_unshuffle", loaded_only=True)
def _patch_videollama3_pixel_unshuffle_gathered(original: Any) -> Any:
    """VideoLLaMA3's merge-block downsampling of every image at once, as a gather of each block's centre.

    Pattern: ``hidden_states.split(grid_thw.prod(dim=1).tolist())`` and, per image, a view back to the
    raster ``(t, h, w, c)`` and a bilinear ``interpolate`` to ``(h / m, w / m)``; the grid is data,
    so the views guard on its values ("Could not guard on data-dependent expression 64*u12*u13*u6 <
    2") in static exports too. Downsampling by exactly ``m`` (bilinear, no corner alignment) samples
    each ``m x m`` block at its centre, ``(m - 1) / 2`` from its first row and column: the mean of the
    block's middle two rows and columns for an even ``m``, its middle patch for an odd one. The input
    holds each block's patches on ``m * m`` consecutive rows, so the patch gathers those rows for
    every block of every image at once: the same (sum of t * h * w / m^2, channels) output, blocks in
    the order the model emits them.
    Models: VideoLlama3VisionModel (and the models around it).
    Upstream: transformers models/video_llama_3/modeling_video_llama_3.py (``VideoLlama3VisionModel.pixel_unshuffle``);
        no report found
    Remove when: the downsampling is computed without a per-image loop.
    """

    @functools.wraps(original)
    def pixel_unshuffle(self: Any, hidden_states: torch.Tensor, grid_thw: torch.Tensor, merge_sizes: torch.Tensor) -> torch.Tensor:
        if hidden_states.dim() != 2:
            return original(self, hidden_states, grid_thw, merge_sizes)
        grid = grid_thw.long()
        m = torch.as_tensor(merge_sizes, device=grid.device).long().reshape(-1).expand(grid.shape[0])
        per_block = m * m
        blocks = grid[:, 0] * (grid[:, 1] // m) * (grid[:, 2] // m)
        image, block = packed_positions(blocks)
        image_start = (torch.cumsum(grid[:, 0] * grid[:, 1] * grid[:, 2], 0) - grid[:, 0] * grid[:, 1] * grid[:, 2])[image]
        size = m[image]
        first = image_start + block * per_block[image]  # the block's first row
        low, high = (size - 1) // 2, size // 2  # the centre rows (and columns) inside the block
        corners = [first + r * size + c for r in (low, high) for c in (low, high)]
        picked = torch.stack([hidden_states[index] for index in corners], dim=0)  # (4, blocks, channels)
        return picked.mean(dim=0)

    return pixel_unshuffle

"""Model-based texture channels: question <-> content coupling (text lines, objects, CLIP) and learned saliency.

Importing the package registers them; each loads its model lazily on first use, so registration is cheap
and a missing model package only matters to the channel that needs it.
"""

from arr_coc.engine import pixel_channels  # noqa: F401  (the built-in channels register first: listings start with them)
from arr_coc.engine.channels import clip, learned_saliency, objects, text, text_layer  # noqa: F401

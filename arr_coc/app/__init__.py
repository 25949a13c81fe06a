"""The microscope: a web app (Gradio) to see and steer where the token budget goes (``arr-coc serve``)."""

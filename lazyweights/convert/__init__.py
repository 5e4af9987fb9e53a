"""The conversion engine, both ways: Hugging Face checkpoints to GGUF and GGUF files to Hugging Face folders.

It reads the records of `lazyweights.adapters` (`archs`, `vision_archs`, their per-family hooks and name
tables) and holds no family of its own; one module a job:
- `tensors`: tensor names and llama.cpp's value transforms, both ways (`gguf_to_hf`, `hf_to_gguf`);
- `hparams`: config.json <-> GGUF `{arch}.*` keys, both ways; `shape_checks`: every tensor's shape against
  them, before a byte is written; `transforms`: the value transforms themselves (RoPE row permutation, ...);
- `hf_export`: whole models (`convert_hf_to_gguf`, `export_gguf`; `convert_gguf_state_dict`, `export_hf_folder`);
- `mmproj` / `mmproj_to_hf`: a multimodal model's vision tower and projector, to an mmproj GGUF and back.

The package imports nothing on import; `lazyweights.adapters` re-exports the adapters users name.
"""

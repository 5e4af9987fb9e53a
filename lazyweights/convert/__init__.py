"""The conversion engine, both ways: Hugging Face checkpoints to GGUF and GGUF files to Hugging Face folders.

It reads the records of `lazyweights.adapters` (`archs`, `vision_archs`, their per-family hooks and name
tables) and holds no family of its own; one module a job:
- `tensors`: tensor names and llama.cpp's value transforms, both ways (`gguf_to_hf`, `hf_to_gguf`);
- `hparams`: config.json <-> GGUF `{arch}.*` keys, both ways; `shape_checks`: every tensor's shape against
  them, before a byte is written; `transforms`: the value transforms themselves (RoPE row permutation, ...);
- `to_gguf`: a whole Hugging Face model to GGUF (`convert_hf_to_gguf`, `export_gguf`), with its metadata;
- `to_hf`: a whole GGUF to a Hugging Face folder (`convert_gguf_state_dict`, `export_hf_folder`), with its config;
- what both directions share: `rope` (the RoPE factor maths one writes and the other reads back) and `result`
  (`ConvertedStateDict`, the tensors with their metadata or files, and `save_converted`);
- `mmproj` / `mmproj_to_hf`: a multimodal model's vision tower and projector, to an mmproj GGUF and back.

The package imports nothing on import; `lazyweights.adapters` re-exports the adapters users name.
"""

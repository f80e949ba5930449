#!/usr/bin/env python3
"""The random Llama-3.1-8B of ../shared/tools/make_random_model.py with fewer
layers (every matrix of the 8B's shape, the embeddings and LM head too), for
per-layer kernel profiles that do not need the 16 GB model:
  python3 make_llama8b_layers.py N_LAYERS OUT_DIR
"""
import os, sys
sys.path.insert(0, os.path.join(os.environ.get("RILL_SHARED_DIR", "/work/shared"), "tools"))
import make_random_model as m

mtype, tok, kw = m.PRESETS["llama-3.1-8b"]
name = f"llama-3.1-8b-{sys.argv[1]}l"
m.PRESETS[name] = (mtype, tok, dict(kw, num_hidden_layers=int(sys.argv[1])))
sys.argv = [sys.argv[0], name, sys.argv[2]]
m.main()

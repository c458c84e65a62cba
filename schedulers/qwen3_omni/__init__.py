"""Qwen3-Omni (transformers' ``qwen3_omni_moe``) served as a graph of stages, one folder per part of the model.

The parts, in the order a request meets them (no part imports another; what they share lives here)::

    front/      the chat request → the thinker's input
        processor.py    the checkpoint's tokenizer, feature extractor and image processor (no video)
        preprocess.py   the preprocess stage: chat inputs → token ids, audio features, pixels, knobs
        encoders.py     the audio and image encoder stages (the thinker's audio and vision towers)
        aggregate.py    the fan-in stage where the thinker's input is whole
    thinker/    the language model: text tokens, and the hidden states the talker speaks from
        stage.py        the thinker stage (inbox/outbox, streaming to decode and the talker)
        engine.py       continuous batching: requests join and leave between decode steps
        model.py        the text model and head, with the encoders' embeddings put in place
        sampling.py     how the next token is picked, as ``generate`` does
        text_decode.py  the decode stage: tokens → UTF-8-safe text deltas (terminal for text)
    talker/     the thinker's stream → codec frames
        stage.py        the talker stage (many requests per step)
        request.py      one request's life at the talker
        prompt.py       the talker's prompt and per-step text, as ``generate`` builds them
        model.py        the talker's weights and forwards
        code_predictor.py  one step's first codes → whole frames
        codec_sampling.py  how codes are picked, as ``generate`` does
    code2wav/   codec frames → 24 kHz speech (terminal for audio)
        stage.py        the code2wav stage
        model.py        the vocoder run window by window
        windows.py      the streaming window schedule: which frames next, which samples are final

At the family level: :mod:`.checkpoint` reads a checkpoint directory (each stage loads only the weights
of the part it runs); :mod:`.graph` is the ingress, the routes between the parts, the terminal stages and
the aggregate's merge (``configs/qwen3-omni.toml`` names its functions); :mod:`.handoffs` is what
crosses each edge of that graph, one class per edge.  The step loop, the KV batch and the admission the
thinker, talker and code predictor run on are the engine layer's (:mod:`schedulers.engine`).
"""

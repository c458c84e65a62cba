"""What every omni family's front shares: the chat request read, the checkpoint's processor, the stages.

* :mod:`.chat`: an OpenAI chat request → transformers chat messages with their media decoded, whether
  the answer is spoken and in which voice, the client's numbers; errors that name the field;
* :mod:`.processor`: a Qwen omni checkpoint's processor without video (tokenizer, feature extractor,
  image processor, chat template), the placeholders expanded as transformers expands them;
* :mod:`.stages`: the preprocess stage (a client's mistake is a 400), encoder stages batched across
  requests, the aggregate stage.

The routes between these stages are :mod:`schedulers.graph.front`'s; a family's ``front/`` package adds
its own processor rules (audio features, token counts), speakers, handoffs and towers.
"""

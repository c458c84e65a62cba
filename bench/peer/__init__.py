"""The reference runtime (SGLang-Omni 0.1.9) driven with the same toy pipelines, in its own venv."""

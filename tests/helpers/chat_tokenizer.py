"""A tokenizer with a chat template, for the tests that render chat prompts (ours and verl's)."""

from reasonrl_fast.models.tiny import char_tokenizer

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def templated_tokenizer():
    """The embedded model's character tokenizer with TEMPLATE as its chat template."""
    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    return tok

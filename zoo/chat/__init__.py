"""Conversations: the checkpoint's own chat template (zoo.chat.template) and the token ids and
assistant-token masks of rendered conversations (zoo.chat.tokens), and the two together for
generation (zoo.chat.chat: the prompt, and the end-of-turn token to stop at).

    template = zoo.chat.ChatTemplate.find("smollm2/")
    text = template.render(messages, add_generation_prompt=True)
    chat = zoo.chat.encode_chat(template, tokenizer, messages)   # ids, and the mask of what SFT trains
    print(chat.show_mask())                                       # the text with trained tokens in ⟦ ⟧
"""

from zoo.chat.chat import Chat, EncodedChat, encode_chat
from zoo.chat.template import ChatTemplate, ChatTemplateError, normalize_messages
from zoo.chat.tokens import TOKENIZER_FILE, ChatTokenizer, Encoded, mask_from_offsets

__all__ = ["TOKENIZER_FILE", "Chat", "ChatTemplate", "ChatTemplateError", "ChatTokenizer", "Encoded", "EncodedChat",
           "encode_chat", "mask_from_offsets", "normalize_messages"]

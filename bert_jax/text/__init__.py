"""Text: tokenizers (`tokenization`) and the one `[CLS] a [SEP] b [SEP]` encoder (`pairs`)."""

"""A small pre-norm transformer block in plain torch (LayerNorm or RMSNorm), Hugging Face style, for
the norm-swap and training tests."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, dim, heads, norm):
        super().__init__()
        self.input_layernorm = norm(dim)
        self.attn = Attention(dim, heads)
        self.post_attention_layernorm = norm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Fp32LayerNorm(nn.LayerNorm):
    """torch's LayerNorm on x of a lower precision than its fp32 weights (which F.layer_norm refuses):
    computed in fp32, rounded once to x's dtype, as normjit computes it."""

    def forward(self, x):
        return super().forward(x.float()).to(x.dtype)


class Fp32RMSNorm(nn.RMSNorm):
    """As Fp32LayerNorm, for RMSNorm (whose output would otherwise take the weights' fp32)."""

    def forward(self, x):
        return super().forward(x.float()).to(x.dtype)


def use_fp32_norms(model):
    """Makes the norms of a model in a lower precision fp32 and computes them as normjit does."""
    for m in model.modules():
        if isinstance(m, (nn.LayerNorm, nn.RMSNorm)):
            m.float()
            m.__class__ = Fp32LayerNorm if isinstance(m, nn.LayerNorm) else Fp32RMSNorm
    return model


class TinyLM(nn.Module):
    """Embedding, `layers` blocks, a final norm and a head: 2 * layers + 1 norm modules."""

    def __init__(self, vocab=256, dim=128, heads=4, layers=2, norm="layernorm"):
        super().__init__()
        make = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}[norm]
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, make) for _ in range(layers))
        self.norm = make(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))

    def loss(self, tokens):
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

"""Planted wrong answers for notebooks/solutions/08_moc_mixture_of_chapters.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)
and, for some, the phrases the check's message must contain)]. tests/test_mutants.py
substitutes each one and proves the check cell rejects it (and says so).
"""

MUTANTS = {
    "nb08-05": [  # my_chapter_weights
        ("top-k over every chapter, the shared ones included",
         "top_p, top_i = probs[..., n_shared:].topk(top_k, dim=-1)",
         "top_p, top_i = probs.topk(top_k, dim=-1)"),
        ("routed indices not shifted by n_shared",
         "top_i + n_shared], dim=-1)", "top_i], dim=-1)"),
        ("routed weights not renormalised over the top k",
         "routed = routed_scale * top_p / top_p.sum(dim=-1, keepdim=True)",
         "routed = routed_scale * top_p"),
        ("missing final normalisation: weights sum to S + routed_scale",
         "/ (n_shared + routed_scale)", ""),
        ("normalised by 1 + routed_scale whatever the number of shared chapters",
         "/ (n_shared + routed_scale)", "/ (1 + routed_scale)"),
        ("router gradient cut: the top-k probabilities detached",
         "routed = routed_scale * top_p / top_p.sum(dim=-1, keepdim=True)",
         "routed = routed_scale * top_p.detach() / top_p.detach().sum(dim=-1, keepdim=True)"),
        ("routed_scale forgotten: the routed weights are ŵ alone",
         "routed = routed_scale * top_p / top_p.sum(dim=-1, keepdim=True)",
         "routed = top_p / top_p.sum(dim=-1, keepdim=True)"),
        ("calls the kit's moc.chapter_weights where it can (S = 1)",
         "top_p, top_i = probs[..., n_shared:].topk(top_k, dim=-1)",
         "if n_shared == 1:\n        return moc.chapter_weights(probs, top_k, routed_scale)\n"
         "    top_p, top_i = probs[..., n_shared:].topk(top_k, dim=-1)"),
    ],
    "nb08-08": [  # my_load_balance + the three values
        ("f summed over the decisions instead of averaged",
         ".to(probs.dtype).mean(dim=0)", ".to(probs.dtype).sum(dim=0)"),
        ("the factor C forgotten",
         "return c * (f * probs.mean(dim=0)).sum()", "return (f * probs.mean(dim=0)).sum()"),
        ("one-hot counts summed over the decisions, then averaged over the k slots",
         "F.one_hot(routed_ids, c).sum(dim=1)", "F.one_hot(routed_ids, c).sum(dim=0)"),
        ("uniform router: k forgotten (1)",
         "uniform_value = top_k", "uniform_value = 1"),
        ("collapsed router: C / k",
         "collapsed_value = n_chapters", "collapsed_value = n_chapters / top_k"),
        ("parked router: 1, as if balanced",
         "parked_value = 0.0", "parked_value = 1.0"),
        ("calls the kit's moc.load_balance_loss",
         "return c * (f * probs.mean(dim=0)).sum()",
         "return moc.load_balance_loss(probs, routed_ids)"),
    ],
    "nb08-12": [  # my_z_loss + the two values
        ("not squared",
         "torch.logsumexp(logits, dim=-1).pow(2).mean()", "torch.logsumexp(logits, dim=-1).mean()"),
        ("logsumexp over the wrong dimension",
         "torch.logsumexp(logits, dim=-1)", "torch.logsumexp(logits, dim=0)"),
        ("max logit instead of logsumexp",
         "torch.logsumexp(logits, dim=-1)", "logits.amax(dim=-1)"),
        ("square of the mean instead of the mean of the squares",
         ".pow(2).mean()", ".mean().pow(2)"),
        ("uniform value not squared",
         "uniform_z = math.log(n_chapters) ** 2", "uniform_z = math.log(n_chapters)"),
        ("shifted logits predicted to give the same L_z (shift invariance of softmax)",
         "shifted_z = (3 + math.log(n_chapters)) ** 2", "shifted_z = math.log(n_chapters) ** 2"),
        ("calls the kit's moc.z_loss",
         "return torch.logsumexp(logits, dim=-1).pow(2).mean()", "return moc.z_loss(logits)"),
    ],
    "nb08-18": [  # reading the routing trace
        ("the shared chapter 0 counted too",
         "routed = chapters[..., 1:].flatten(0, 1)", "routed = chapters.flatten(0, 1)"),
        ("fraction of all k reads instead of the decisions",
         "counts[most_used].item() / routed.shape[0]", "counts[most_used].item() / routed.numel()"),
        ("argmax over counts[1:] without adding 1 back",
         "most_used = int(counts.argmax())", "most_used = int(counts[1:].argmax())"),
        ("window 0: any instead of all",
         "(chapters[:, 0] == chapters[0, 0]).all()", "(chapters[:, 0] == chapters[0, 0]).any()"),
        ("window 0: compares the windows of sequence 0, not window 0 of every sequence",
         "(chapters[:, 0] == chapters[0, 0]).all()", "(chapters[0] == chapters[0, 0]).all()"),
    ],
    "nb08-25": [  # capstone: MyMoCBlock, route_windows, read_chapters
        ("router reads the current window: window w routed from the tokens up to its own end "
         "(a look-ahead)",
         "sums = x.cumsum(dim=1)[:, r - 1:(n_windows - 1) * r:r]",
         "sums = x.cumsum(dim=1)[:, 2 * r - 1::r]",
         ("not causal", "position 16 (window 1)", "the router's scores")),
        ("router input is h after attention, not the stream x entering the block",
         "routing = route_windows(self, x)\n        h = x + self.attn(self.norm1(x), positions)",
         "h = x + self.attn(self.norm1(x), positions)\n        routing = route_windows(self, h)",
         ("layer 0: the router's scores, window 1",)),
        ("softmax over the windows instead of the chapters",
         "probs = logits.softmax(dim=-1)", "probs = logits.softmax(dim=1)"),
        ("top-k over all chapters, the shared one included",
         "probs[..., 1:].topk(block.top_k, dim=-1)", "probs.topk(block.top_k, dim=-1)"),
        ("routed weights not renormalised over the top k",
         "routed = block.routed_scale * top_p / top_p.sum(dim=-1, keepdim=True)",
         "routed = block.routed_scale * top_p"),
        ("shared chapter dropped: only the k routed chapters are read",
         "weights = torch.cat([shared, routed], dim=-1) / (1 + block.routed_scale)\n"
         "    ids = torch.cat([torch.zeros_like(top_i[..., :1]), top_i + 1], dim=-1)",
         "weights = routed / block.routed_scale\n    ids = top_i + 1"),
        ("a chapter's rows taken with stride 1: chapter c read from row c",
         "routing.chapter_ids[..., None] * n_len + torch.arange",
         "routing.chapter_ids[..., None] + torch.arange"),
        ("gathered rows not RMS-normalised",
         "mem = mem * torch.rsqrt(mem.pow(2).mean(dim=-1, keepdim=True) + block.eps)",
         "mem = mem", ("the routing matches the kit's", "cross-attention")),
        ("chapter weight scales the values only, not the keys",
         "mem = (mem * routing.weights[..., None, None]).flatten(2, 3)         # (B, W, M, D)\n"
         "    keys, values = block.memory.kv(mem).chunk(2, dim=-1)",
         "mem = mem.flatten(2, 3)\n    keys, values = block.memory.kv(mem).chunk(2, dim=-1)\n"
         "    values = values * routing.weights.repeat_interleave(n_len, dim=-1)[..., None]"),
        ("read softmax over the queries instead of the memory tokens",
         "scores.softmax(dim=-1)", "scores.softmax(dim=-2)", ("not causal",)),
        ("calls the kit's moc.chapter_weights for the selection",
         "return moc.Routing(logits, probs, ids, weights)",
         "return moc.Routing(logits, probs, *moc.chapter_weights(probs, block.top_k, "
         "block.routed_scale))"),
    ],
}

_REDEFINE = "return None\n\n\n"          # ends the original body; what follows is top level
_LAST = "return torch.cat([shared_ids, top_i + n_shared], dim=-1), weights"
CHEATS = {
    "nb08-05": [  # my_chapter_weights: routes to the kit's moc.chapter_weights
        ("getattr with the name built at run time",
         _LAST, "return getattr(moc, 'chapter_' + 'weights')(probs, top_k, routed_scale)"),
        ("kept in a default argument",
         _LAST, _REDEFINE + "def my_chapter_weights(probs, top_k, routed_scale, n_shared=1, "
                "_kit=moc.chapter_weights):\n    return _kit(probs, top_k, routed_scale)"),
        ("eval of the name",
         _LAST, "return eval('moc.chapter' + '_weights')(probs, top_k, routed_scale)"),
    ],
}

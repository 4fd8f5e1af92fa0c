"""Chess-move sequences the project generates itself (nothing is downloaded).

A tiny move generator plays games from the standard start position and writes them in
coordinate notation, one move per word: ``e2e4 e7e5 g1f3 b8c6 f1c4 ... e7e8q``. Rules: every
piece moves as in chess (pawn single/double pushes and captures, promotion to a queen, knight,
bishop, rook, queen, king), a move may not leave the mover's own king attacked, and a side
with no legal move ends the game (mate or stalemate). Castling, en passant and the draw rules
are left out. Moves are not uniform: captures are preferred in proportion to the captured
piece's value, promotions strongly, and in the first moves knights, central pawns and bishops
are "developed" first -- so the sequences have structure a small language model can learn
(syntax, which squares hold the side to move's pieces, how each piece moves, typical openings).

Tokens are characters: ``<pad> <bos> <eos>``, space, files ``a-h``, ranks ``1-8`` and the
promotion letters ``q r b n`` (24 tokens). Sample ``i`` is the first ``seq_len + 1`` tokens of
game ``i`` (``<bos>`` + moves), padded with ``<pad>`` when the game ends sooner; the padding is
ignored by the loss. Game ``i`` depends only on ``(seed, i)``, so every process, backend and
strategy sees identical data; held-out games come from another index range.

    data = ChessMoves(seq_len=64, seed=0)
    x, y = data.batch(range(8))            # LongTensor [8, 64] inputs and next-token targets
    data.text(0)                           # 'e2e4 g8f6 b1c3 ...'
    python examples/chess_data.py --games 3 --seq-len 64   # print a few samples
"""
from __future__ import annotations

import argparse
import random
from typing import Iterable, List, Optional, Tuple

import torch

# ----------------------------------------------------------------------------------- tokens

PAD, BOS, EOS = 0, 1, 2
VOCAB = ["<pad>", "<bos>", "<eos>", " "] + list("abcdefgh") + list("12345678") + list("qrbn")
STOI = {s: i for i, s in enumerate(VOCAB)}
IGNORE = -100  # targets at padding positions

# ----------------------------------------------------------------------------------- board
# 10x12 mailbox: squares 21..98, a1 = 21, h8 = 98; off-board squares hold None.
_EMPTY = "."
_START = ["RNBQKBNR", "P" * 8, "", "", "", "", "p" * 8, "rnbqkbnr"]
_N_STEPS = (-21, -19, -12, -8, 8, 12, 19, 21)
_K_STEPS = (-11, -10, -9, -1, 1, 9, 10, 11)
_B_DIRS = (-11, -9, 9, 11)
_R_DIRS = (-10, -1, 1, 10)
_VALUE = {"p": 1, "n": 3, "b": 3, "r": 5, "q": 9, "k": 0}


def sq_name(sq: int) -> str:
    return "abcdefgh"[sq % 10 - 1] + str(sq // 10 - 1)


def sq_index(name: str) -> int:
    return (int(name[1]) + 1) * 10 + "abcdefgh".index(name[0]) + 1


def start_board() -> list:
    b: list = [None] * 120
    for r in range(8):
        row = _START[r] or _EMPTY * 8
        row = row if len(row) == 8 else _EMPTY * 8
        for f in range(8):
            b[(r + 2) * 10 + f + 1] = row[f]
    return b


def _own(p, white: bool) -> bool:
    return p is not None and p != _EMPTY and p.isupper() == white


def _enemy(p, white: bool) -> bool:
    return p is not None and p != _EMPTY and p.isupper() != white


def attacked(b: list, sq: int, by_white: bool) -> bool:
    """Is ``sq`` attacked by a piece of the side ``by_white``?"""
    n, bsh, r, q, k, pawn = ("N", "B", "R", "Q", "K", "P") if by_white else "nbrqkp"
    for s in _N_STEPS:
        if b[sq + s] == n:
            return True
    for s in _K_STEPS:
        if b[sq + s] == k:
            return True
    for s in ((-9, -11) if by_white else (9, 11)):  # pawns attack forwards
        if b[sq + s] == pawn:
            return True
    for dirs, (p1, p2) in ((_B_DIRS, (bsh, q)), (_R_DIRS, (r, q))):
        for d in dirs:
            t = sq + d
            while b[t] == _EMPTY:
                t += d
            if b[t] == p1 or b[t] == p2:
                return True
    return False


def pseudo_moves(b: list, white: bool) -> List[Tuple[int, int, str]]:
    """All moves of ``white``'s side ignoring checks: ``(from, to, promotion letter or '')``."""
    out = []
    fwd, start_rank, last_rank = (10, 3, 9) if white else (-10, 8, 2)
    for sq in range(21, 99):
        p = b[sq]
        if not _own(p, white):
            continue
        kind = p.lower()
        if kind == "p":
            t = sq + fwd
            promo = "q" if t // 10 == last_rank else ""
            if b[t] == _EMPTY:
                out.append((sq, t, promo))
                if sq // 10 == start_rank and b[t + fwd] == _EMPTY:
                    out.append((sq, t + fwd, ""))
            for side in (-1, 1):
                if _enemy(b[t + side], white):
                    out.append((sq, t + side, promo))
        elif kind in "nk":
            for s in (_N_STEPS if kind == "n" else _K_STEPS):
                t = sq + s
                if b[t] == _EMPTY or _enemy(b[t], white):
                    out.append((sq, t, ""))
        else:
            dirs = _B_DIRS if kind == "b" else _R_DIRS if kind == "r" else _B_DIRS + _R_DIRS
            for d in dirs:
                t = sq + d
                while b[t] == _EMPTY:
                    out.append((sq, t, ""))
                    t += d
                if _enemy(b[t], white):
                    out.append((sq, t, ""))
    return out


def make_move(b: list, move: Tuple[int, int, str]) -> list:
    frm, to, promo = move
    nb = b[:]
    p = nb[frm]
    nb[to] = (promo.upper() if p.isupper() else promo) if promo else p
    nb[frm] = _EMPTY
    return nb


def is_legal(b: list, move, white: bool) -> bool:
    nb = make_move(b, move)
    king = "K" if white else "k"
    return not attacked(nb, nb.index(king), not white)


def legal_moves(b: list, white: bool) -> List[Tuple[int, int, str]]:
    return [m for m in pseudo_moves(b, white) if is_legal(b, m, white)]


def move_str(m) -> str:
    return sq_name(m[0]) + sq_name(m[1]) + m[2]


def _weight(b: list, m, ply: int) -> float:
    frm, to, promo = m
    kind, target = b[frm].lower(), b[to]
    w = 1.0
    if target != _EMPTY:
        w += 4.0 * _VALUE[target.lower()]
    if promo:
        w += 30.0
    if ply < 8:  # openings: develop knights and central pawns, then bishops
        file = frm % 10
        if kind == "n":
            w += 6.0
        elif kind == "p" and file in (4, 5):
            w += 8.0
        elif kind == "b":
            w += 2.0
        elif kind in "qk":
            w *= 0.2
    return w


def play_game(rng: random.Random, max_plies: int) -> List[str]:
    """One game, at most ``max_plies`` moves, as coordinate strings."""
    b, white, moves = start_board(), True, []
    for ply in range(max_plies):
        cands = pseudo_moves(b, white)
        weights = [_weight(b, m, ply) for m in cands]
        chosen = None
        while cands:  # rejection sampling: check legality of the drawn move only
            i = rng.choices(range(len(cands)), weights)[0]
            if is_legal(b, cands[i], white):
                chosen = cands[i]
                break
            cands.pop(i)
            weights.pop(i)
        if chosen is None:  # mate or stalemate
            break
        moves.append(move_str(chosen))
        b = make_move(b, chosen)
        white = not white
    return moves


def replay(moves: Iterable[str]):
    """Board and side to move after ``moves`` (assumed legal)."""
    b, white = start_board(), True
    for s in moves:
        b = make_move(b, (sq_index(s[:2]), sq_index(s[2:4]), s[4:]))
        white = not white
    return b, white


# ----------------------------------------------------------------------------------- dataset


class ChessMoves:
    """Deterministic character-level chess-move samples (see the module docstring)."""

    vocab = VOCAB
    vocab_size = len(VOCAB)
    EVAL_OFFSET = 1 << 40  # held-out games use indices from here on

    def __init__(self, seq_len: int = 64, seed: int = 0, max_plies: Optional[int] = None):
        self.seq_len, self.seed = seq_len, seed
        # enough moves to fill a sample (a move is 4-5 characters plus a space)
        self.max_plies = max_plies or seq_len // 5 + 2
        self._cache: dict = {}

    def game(self, index: int) -> List[str]:
        g = self._cache.get(index)
        if g is None:
            g = play_game(random.Random(self.seed * 1_000_003 + index), self.max_plies)
            self._cache[index] = g
        return g

    def text(self, index: int) -> str:
        return " ".join(self.game(index))

    @staticmethod
    def encode(text: str) -> List[int]:
        return [STOI[c] for c in text]

    @staticmethod
    def decode(ids: Iterable[int]) -> str:
        return "".join(VOCAB[i] if i >= 4 or i == 3 else "" for i in ids)

    def tokens(self, index: int) -> torch.Tensor:
        ids = [BOS] + self.encode(self.text(index)) + [EOS]
        ids = ids[:self.seq_len + 1]
        return torch.tensor(ids + [PAD] * (self.seq_len + 1 - len(ids)), dtype=torch.long)

    def batch(self, indices: Iterable[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        t = torch.stack([self.tokens(i) for i in indices])
        x, y = t[:, :-1].contiguous(), t[:, 1:].clone()
        y[y == PAD] = IGNORE
        return x, y

    def prefetch(self, indices: Iterable[int]) -> None:
        for i in indices:
            self.game(i)

    # -- a quality metric: does the model propose legal moves?
    def move_prompts(self, indices: Iterable[int], plies_range=(2, 8),
                     plies: Optional[Iterable[int]] = None):
        """For each game: (token ids of ``<bos>`` + its first ``k`` moves + space, those moves);
        ``k`` drawn from ``plies_range``, or given per game by ``plies`` (cut where the game
        ends if it is shorter)."""
        out = []
        cuts = list(plies) if plies is not None else None
        for j, i in enumerate(indices):
            g = self.game(i)
            rng = random.Random(self.seed * 7919 + i)
            k = min(len(g), cuts[j] if cuts is not None else rng.randint(*plies_range))
            prefix = g[:k]
            ids = [BOS] + self.encode(" ".join(prefix) + (" " if prefix else ""))
            out.append((ids, prefix))
        return out


def legal_fraction(completions: List[str], prefixes: List[List[str]]) -> float:
    """Fraction of ``completions`` (the next word a model wrote) that are legal moves."""
    ok = 0
    for text, prefix in zip(completions, prefixes):
        word = text.strip().split(" ")[0] if text.strip() else ""
        b, white = replay(prefix)
        if word in {move_str(m) for m in legal_moves(b, white)}:
            ok += 1
    return ok / max(1, len(completions))


def main() -> None:
    p = argparse.ArgumentParser(description="print a few generated chess samples")
    p.add_argument("--games", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time", type=int, default=0, help="also time generating this many games")
    a = p.parse_args()
    d = ChessMoves(a.seq_len, a.seed)
    for i in range(a.games):
        print(f"game {i}: {d.text(i)}")
        print(f"  sample tokens: {d.tokens(i).tolist()}")
    if a.time:
        import time
        t0 = time.perf_counter()
        d.prefetch(range(a.games, a.games + a.time))
        dt = time.perf_counter() - t0
        print(f"{a.time} games of <= {d.max_plies} plies in {dt:.2f} s "
              f"({dt / a.time * 1e3:.2f} ms/game)")
    # sanity: moves replayed through the rules are all legal
    for i in range(a.games):
        g = d.game(i)
        for k in range(len(g)):
            assert legal_fraction([g[k]], [g[:k]]) == 1.0, (i, k, g[k])
    print("replay check: every generated move is legal")


if __name__ == "__main__":
    main()

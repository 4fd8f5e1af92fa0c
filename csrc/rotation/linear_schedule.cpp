#include "rotation/linear_schedule.h"

#include <optional>
#include <utility>

namespace rsdp {
namespace {

// One hop in flight.
class Hop {
 public:
  void start(RingHops& ring, const at::Tensor& send, const at::Tensor& recv, int direction,
             const std::optional<at::Tensor>& add) {
    wait_ = ring.start(send, recv, direction, add);
  }
  void wait() {
    if (!wait_) return;
    auto w = std::exchange(wait_, nullptr);
    w();
  }

 private:
  std::function<void()> wait_;
};

// Shard j's weight in `buf` in its stored layout ([out_j, in] / [out, in_j]; transposed
// [in, out_j] / [in_j, out]).
at::Tensor stored(const LinearGeometry& g, const at::Tensor& buf, int64_t j) {
  const int64_t r = g.split_out ? g.fin : g.sizes[j];
  const int64_t c = g.split_out ? g.sizes[j] : g.fout;
  const int64_t off = buf.storage_offset() + g.w_off;
  return g.transposed ? buf.as_strided({r, c}, {c, 1}, off) : buf.as_strided({c, r}, {r, 1}, off);
}

// Shard j's weight in `buf` as w_io [in_j, out] / [in, out_j].
at::Tensor w_io(const LinearGeometry& g, const at::Tensor& buf, int64_t j) {
  return g.transposed ? stored(g, buf, j) : stored(g, buf, j).t();
}

// Writes xs^T d (w_io's gradient) into shard j's weight region of `buf`, in its stored layout.
void grad_w(const LinearGeometry& g, const at::Tensor& buf, int64_t j, const at::Tensor& xs,
            const at::Tensor& d) {
  at::Tensor dst = stored(g, buf, j);
  if (g.transposed)
    at::mm_out(dst, xs.t(), d);
  else
    at::mm_out(dst, d.t(), xs);
}

at::Tensor bias(const LinearGeometry& g, const at::Tensor& buf, int64_t j) {
  return buf.as_strided({g.sizes[j]}, {1}, buf.storage_offset() + g.b_off);
}

// The dimension of the stored whole weight ([out, in], or [in, out] transposed) that the
// split runs along.
int64_t split_dim(const LinearGeometry& g) { return (g.split_out != g.transposed) ? 0 : 1; }

// [Note: whole small layers]
// A layer smaller than its activations (sharded_linear._whole: in * out <= tokens * (in + out))
// costs more in per-shard matmuls than in arithmetic: each re-reads (and the matmul library
// re-packs) the whole input or output gradient, and the per-shard products are small. There
// the shards are copied into one whole weight as they pass and the layer computes with one
// matmul: a temporary the size of the layer, no larger than the activations it already holds.
// Layers larger than their activations (the case RSDP is for) never make one.
class WholeWeight {
 public:
  WholeWeight(const LinearGeometry& g, const at::Tensor& like, bool with_bias) : g_(g) {
    w_ = g.transposed ? at::empty({g.fin, g.fout}, like.options())
                      : at::empty({g.fout, g.fin}, like.options());
    if (with_bias && g.split_out && g.b_off >= 0) b_ = at::empty({g.fout}, like.options());
  }
  void place(int64_t j, const at::Tensor& buf) {
    if (!g_.sizes[j]) return;
    w_.narrow(split_dim(g_), g_.starts[j], g_.sizes[j]).copy_(stored(g_, buf, j));
    if (b_.defined()) b_.narrow(0, g_.starts[j], g_.sizes[j]).copy_(bias(g_, buf, j));
  }
  // The whole weight as w_io [in, out].
  at::Tensor io() const { return g_.transposed ? w_ : w_.t(); }
  const at::Tensor& bias_or_undefined() const { return b_; }

 private:
  const LinearGeometry& g_;
  at::Tensor w_, b_;
};

// The forward's rotation: visit(j, shard j's flat buffer) for every shard in hand, own first,
// while the next hop (direction +1) is in flight.
template <class Visit>
void rotate(RingHops& ring, const at::Tensor& src, const std::vector<at::Tensor>& bufs,
            const std::vector<int64_t>& origins, Visit&& visit) {
  const int64_t W = static_cast<int64_t>(origins.size());
  at::Tensor cur = src;
  for (int64_t t = 0; t < W; ++t) {
    Hop hop;
    at::Tensor nxt;
    if (t < W - 1) {
      nxt = bufs[t % bufs.size()];
      hop.start(ring, cur, nxt, 1, std::nullopt);
    }
    visit(origins[t], cur);
    if (t < W - 1) {
      hop.wait();
      cur = nxt;
    }
  }
}

}  // namespace

at::Tensor linear_forward(RingHops& ring, const LinearGeometry& g, const at::Tensor& x2,
                          const at::Tensor& src, const std::vector<at::Tensor>& bufs,
                          const std::vector<int64_t>& origins, bool whole) {
  const int64_t N = x2.size(0);
  if (whole) {
    WholeWeight ww(g, src, true);
    rotate(ring, src, bufs, origins, [&](int64_t j, const at::Tensor& cur) { ww.place(j, cur); });
    // split by input features the bias is replicated and added by the caller
    const at::Tensor& bb = ww.bias_or_undefined();
    return bb.defined() ? at::addmm(bb, x2, ww.io()) : at::mm(x2, ww.io());
  }
  at::Tensor y = g.split_out ? at::empty({N, g.fout}, x2.options())
                             : at::zeros({N, g.fout}, x2.options());
  rotate(ring, src, bufs, origins, [&](int64_t j, const at::Tensor& cur) {
    if (!g.sizes[j]) return;
    if (g.split_out) {
      at::Tensor cols = y.narrow(1, g.starts[j], g.sizes[j]);
      if (g.b_off >= 0)
        at::addmm_out(cols, bias(g, cur, j), x2, w_io(g, cur, j));
      else
        at::mm_out(cols, x2, w_io(g, cur, j));
    } else {
      y.addmm_(x2.narrow(1, g.starts[j], g.sizes[j]), w_io(g, cur, j));
    }
  });
  return y;
}

at::Tensor linear_backward(RingHops& ring, const LinearGeometry& g, const at::Tensor& x2,
                           const at::Tensor& dy2, const at::Tensor& src,
                           const at::Tensor& wbuf, const at::Tensor& acc,
                           const at::Tensor& local, const std::vector<int64_t>& origins,
                           bool need_x, bool whole) {
  const int64_t W = static_cast<int64_t>(origins.size()) - 1;
  const bool need_w = acc.defined();
  // [Note: whole small layers]: this rank's contribution to every shard comes from one matmul,
  // in the stored layout of the whole weight, and each shard's part is copied out of it; the
  // weights passing by are copied into one whole weight for one input-gradient matmul at the
  // end. The first weight hop starts before the gradient matmul, to overlap it.
  Hop pw, pg;
  std::optional<WholeWeight> ww;
  if (need_x && whole) {
    ww.emplace(g, src, false);
    ww->place(origins[0], src);
    if (W > 1) pw.start(ring, src, wbuf, -1, std::nullopt);
  }
  at::Tensor G, Gb;
  if (need_w && whole) {
    G = g.transposed ? at::mm(x2.t(), dy2) : at::mm(dy2.t(), x2);
    if (g.split_out && g.b_off >= 0) Gb = dy2.sum(0);
  }
  at::Tensor gx;
  bool gx_written = false;
  if (need_x && !ww) gx = g.split_out ? at::empty_like(x2) : at::zeros_like(x2);

  auto visit = [&](int64_t j, const at::Tensor& buf) {
    if (!g.sizes[j]) return;
    if (g.split_out) {
      at::Tensor d = dy2.narrow(1, g.starts[j], g.sizes[j]);
      if (gx_written)
        gx.addmm_(d, w_io(g, buf, j).t());
      else
        at::mm_out(gx, d, w_io(g, buf, j).t());
      gx_written = true;
    } else {
      at::Tensor cols = gx.narrow(1, g.starts[j], g.sizes[j]);
      at::mm_out(cols, dy2, w_io(g, buf, j).t());
    }
  };
  auto contribute = [&](int64_t j, const at::Tensor& buf) {
    if (!g.sizes[j]) return;
    if (G.defined()) {
      stored(g, buf, j).copy_(G.narrow(split_dim(g), g.starts[j], g.sizes[j]));
      if (Gb.defined()) bias(g, buf, j).copy_(Gb.narrow(0, g.starts[j], g.sizes[j]));
      return;
    }
    if (g.split_out) {
      at::Tensor d = dy2.narrow(1, g.starts[j], g.sizes[j]);
      grad_w(g, buf, j, x2, d);
      if (g.b_off >= 0) {
        at::Tensor bj = bias(g, buf, j);
        at::sum_out(bj, d, {0});
      }
    } else {
      grad_w(g, buf, j, x2.narrow(1, g.starts[j], g.sizes[j]), dy2);
    }
  };

  // rotation.counter_rotate's schedule: the weight hop of step t overlaps the contribution
  // for the gradient hop, which overlaps the next step's visit.
  if (need_w) contribute(origins[1], acc);
  at::Tensor cur;
  for (int64_t t = 0; t < W; ++t) {
    if (ww && t > 0) {
      pw.wait();
      ww->place(origins[t], wbuf);
      if (t < W - 1) pw.start(ring, wbuf, wbuf, -1, std::nullopt);
    } else if (need_x && !ww) {
      if (t == 0) {
        cur = src;
      } else {
        pw.wait();
        cur = wbuf;
      }
      visit(origins[t], cur);
      if (t < W - 1) pw.start(ring, cur, wbuf, -1, std::nullopt);  // in place from t = 1 on
    }
    if (need_w && t < W - 1) {
      pg.wait();  // `local` is read by the hop in flight
      contribute(origins[t + 2], local);
      pg.start(ring, acc, acc, -1, local);
    }
  }
  if (ww) {  // while the last gradient hop is in flight
    gx = at::mm(dy2, ww->io().t());
    gx_written = true;
  }
  pg.wait();
  pw.wait();
  if (need_x && !gx_written && g.split_out) gx.zero_();
  return gx;
}

}  // namespace rsdp

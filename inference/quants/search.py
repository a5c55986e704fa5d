"""ggml's scale searches for small groups of values (ggml-quants.c "Helper functions").

Each function quantizes one group ``x[:n]`` to integer levels written into ``L`` and returns the
scale (and, for the affine searches, the negated minimum) that ggml's search settles on. They
follow the C operation by operation in float32, since the chosen levels and scales must come out
bit for bit the same as ggml's.
"""
import numpy as np
from numba import njit

from .numeric import F0, F1, GROUP_MAX_EPS, nearest_int

_TENTH = np.float32(0.1)


@njit(cache=True, error_model="numpy")
def make_qx_quants(n, nmax, x, L, qw, use_qw):
    """Symmetric levels in [0, 2*nmax) for ``x`` (ggml's make_qx_quants with rmse_type 1).

    The weight of x[i] is ``qw[i]`` when ``use_qw``, else x[i]**2. Sweeps 18 candidate scales
    around -nmax/max and keeps the one with the best weighted least-squares fit.
    """
    vmax = F0
    amax = F0
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            vmax = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F0
    iscale = np.float32(np.float32(-nmax) / vmax)
    sumlx = F0
    suml2 = F0
    for i in range(n):
        l = nearest_int(np.float32(iscale * x[i]))
        l = max(-nmax, min(nmax - 1, l))
        L[i] = l + nmax
        w = qw[i] if use_qw else np.float32(x[i] * x[i])
        fl = np.float32(l)
        sumlx = np.float32(sumlx + np.float32(np.float32(w * x[i]) * fl))
        suml2 = np.float32(suml2 + np.float32(np.float32(w * fl) * fl))
    scale = np.float32(sumlx / suml2) if suml2 != F0 else F0
    best = np.float32(scale * sumlx)
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = np.float32(-np.float32(np.float32(nmax) + np.float32(_TENTH * np.float32(step))) / vmax)
        sumlx = F0
        suml2 = F0
        for i in range(n):
            l = nearest_int(np.float32(iscale * x[i]))
            l = max(-nmax, min(nmax - 1, l))
            w = qw[i] if use_qw else np.float32(x[i] * x[i])
            fl = np.float32(l)
            sumlx = np.float32(sumlx + np.float32(np.float32(w * x[i]) * fl))
            suml2 = np.float32(suml2 + np.float32(np.float32(w * fl) * fl))
        if suml2 > F0 and np.float32(sumlx * sumlx) > np.float32(best * suml2):
            for i in range(n):
                l = nearest_int(np.float32(iscale * x[i]))
                L[i] = nmax + max(-nmax, min(nmax - 1, l))
            scale = np.float32(sumlx / suml2)
            best = np.float32(scale * sumlx)
    return scale


@njit(cache=True, error_model="numpy")
def make_q3_quants(n, nmax, x, L, do_rmse):
    """Symmetric levels in [0, 2*nmax) with x**2-weighted coordinate descent (make_q3_quants)."""
    vmax = F0
    amax = F0
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            vmax = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F0
    iscale = np.float32(np.float32(-nmax) / vmax)
    if do_rmse:
        sumlx = F0
        suml2 = F0
        for i in range(n):
            l = nearest_int(np.float32(iscale * x[i]))
            l = max(-nmax, min(nmax - 1, l))
            L[i] = l
            w = np.float32(x[i] * x[i])
            fl = np.float32(l)
            sumlx = np.float32(sumlx + np.float32(np.float32(w * x[i]) * fl))
            suml2 = np.float32(suml2 + np.float32(np.float32(w * fl) * fl))
        for _ in range(5):
            n_changed = 0
            for i in range(n):
                w = np.float32(x[i] * x[i])
                fli = np.float32(L[i])
                slx = np.float32(sumlx - np.float32(np.float32(w * x[i]) * fli))
                if slx > F0:
                    sl2 = np.float32(suml2 - np.float32(np.float32(w * fli) * fli))
                    new_l = nearest_int(np.float32(np.float32(x[i] * sl2) / slx))
                    new_l = max(-nmax, min(nmax - 1, new_l))
                    if new_l != L[i]:
                        fnl = np.float32(new_l)
                        slx = np.float32(slx + np.float32(np.float32(w * x[i]) * fnl))
                        sl2 = np.float32(sl2 + np.float32(np.float32(w * fnl) * fnl))
                        if sl2 > F0 and np.float32(np.float32(slx * slx) * suml2) > \
                                np.float32(np.float32(sumlx * sumlx) * sl2):
                            L[i] = new_l
                            sumlx = slx
                            suml2 = sl2
                            n_changed += 1
            if n_changed == 0:
                break
        for i in range(n):
            L[i] += nmax
        return np.float32(sumlx / suml2) if suml2 > F0 else F0
    for i in range(n):
        l = nearest_int(np.float32(iscale * x[i]))
        l = max(-nmax, min(nmax - 1, l))
        L[i] = l + nmax
    return np.float32(F1 / iscale)


@njit(cache=True, error_model="numpy")
def make_qkx2_quants(n, nmax, x, weights, L, Laux, sweep):
    """Affine levels in [0, nmax]: scale and min by weighted least squares over a sweep of
    ``nstep + 1`` candidate scales (make_qkx2_quants). Returns (scale, -min).

    ggml's make_qkx2_quants(n, nmax, x, weights, L, &the_min, Laux, rmin, rdelta, nstep, use_mad)
    with its last four arguments as ``sweep = (rmin, rdelta, nstep, use_mad)`` (rmin, rdelta
    float32): candidate iscale (rmin + rdelta * step + nmax) / (max - min) for step in 0..nstep,
    error |diff| if use_mad else diff**2. The min comes back negated instead of through the_min.
    """
    rmin, rdelta, nstep, use_mad = sweep
    vmin = x[0]
    vmax = x[0]
    sum_w = weights[0]
    sum_x = np.float32(sum_w * x[0])
    for i in range(1, n):
        if x[i] < vmin:
            vmin = x[i]
        if x[i] > vmax:
            vmax = x[i]
        w = weights[i]
        sum_w = np.float32(sum_w + w)
        sum_x = np.float32(sum_x + np.float32(w * x[i]))
    if vmin > F0:
        vmin = F0
    if vmax == vmin:
        for i in range(n):
            L[i] = 0
        return F0, -vmin
    fnmax = np.float32(nmax)
    iscale = np.float32(fnmax / np.float32(vmax - vmin))
    scale = np.float32(F1 / iscale)
    best_error = F0
    for i in range(n):
        l = nearest_int(np.float32(iscale * np.float32(x[i] - vmin)))
        L[i] = max(0, min(nmax, l))
        diff = np.float32(np.float32(np.float32(scale * np.float32(L[i])) + vmin) - x[i])
        diff = abs(diff) if use_mad else np.float32(diff * diff)
        best_error = np.float32(best_error + np.float32(weights[i] * diff))
    if nstep < 1:
        return scale, -vmin
    for step in range(nstep + 1):
        iscale = np.float32(np.float32(np.float32(rmin + np.float32(rdelta * np.float32(step))) + fnmax)
                            / np.float32(vmax - vmin))
        sum_l = F0
        sum_l2 = F0
        sum_xl = F0
        for i in range(n):
            l = nearest_int(np.float32(iscale * np.float32(x[i] - vmin)))
            l = max(0, min(nmax, l))
            Laux[i] = l
            w = weights[i]
            fl = np.float32(l)
            sum_l = np.float32(sum_l + np.float32(w * fl))
            sum_l2 = np.float32(sum_l2 + np.float32(np.float32(w * fl) * fl))
            sum_xl = np.float32(sum_xl + np.float32(np.float32(w * fl) * x[i]))
        D = np.float32(np.float32(sum_w * sum_l2) - np.float32(sum_l * sum_l))
        if D > F0:
            this_scale = np.float32(np.float32(np.float32(sum_w * sum_xl) - np.float32(sum_x * sum_l)) / D)
            this_min = np.float32(np.float32(np.float32(sum_l2 * sum_x) - np.float32(sum_l * sum_xl)) / D)
            if this_min > F0:
                this_min = F0
                this_scale = np.float32(sum_xl / sum_l2)
            cur_error = F0
            for i in range(n):
                diff = np.float32(np.float32(np.float32(this_scale * np.float32(Laux[i])) + this_min) - x[i])
                diff = abs(diff) if use_mad else np.float32(diff * diff)
                cur_error = np.float32(cur_error + np.float32(weights[i] * diff))
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                vmin = this_min
    return scale, -vmin


@njit(cache=True, error_model="numpy")
def make_qkx3_quants(n, nmax, x, weights, L, Laux, sweep):
    """make_qkx2_quants' successor used with importance weights (make_qkx3_quants).

    Same search; candidate levels come from min(v, nmax) so a best-so-far min near max cannot
    push nearest_int out of range. Returns (scale, -min). As for `make_qkx2_quants`, ggml's
    trailing (rmin, rdelta, nstep, use_mad) arrive as the tuple ``sweep``."""
    rmin, rdelta, nstep, use_mad = sweep
    vmin = x[0]
    vmax = x[0]
    sum_w = weights[0]
    sum_x = np.float32(sum_w * x[0])
    for i in range(1, n):
        if x[i] < vmin:
            vmin = x[i]
        if x[i] > vmax:
            vmax = x[i]
        w = weights[i]
        sum_w = np.float32(sum_w + w)
        sum_x = np.float32(sum_x + np.float32(w * x[i]))
    if vmin > F0:
        vmin = F0
    if vmax <= vmin:
        for i in range(n):
            L[i] = 0
        return F0, -vmin
    fnmax = np.float32(nmax)
    iscale = np.float32(fnmax / np.float32(vmax - vmin))
    scale = np.float32(F1 / iscale)
    best_mad = F0
    for i in range(n):
        l = nearest_int(np.float32(iscale * np.float32(x[i] - vmin)))
        L[i] = max(0, min(nmax, l))
        diff = np.float32(np.float32(np.float32(scale * np.float32(L[i])) + vmin) - x[i])
        diff = abs(diff) if use_mad else np.float32(diff * diff)
        best_mad = np.float32(best_mad + np.float32(weights[i] * diff))
    if nstep < 1:
        return scale, -vmin
    for step in range(nstep + 1):
        iscale = np.float32(np.float32(np.float32(rmin + np.float32(rdelta * np.float32(step))) + fnmax)
                            / np.float32(vmax - vmin))
        sum_l = F0
        sum_l2 = F0
        sum_xl = F0
        for i in range(n):
            v = np.float32(iscale * np.float32(x[i] - vmin))
            l = 0
            if v > F0:
                l = nearest_int(v if v < fnmax else fnmax)
            Laux[i] = l
            w = weights[i]
            fl = np.float32(l)
            sum_l = np.float32(sum_l + np.float32(w * fl))
            sum_l2 = np.float32(sum_l2 + np.float32(np.float32(w * fl) * fl))
            sum_xl = np.float32(sum_xl + np.float32(np.float32(w * fl) * x[i]))
        D = np.float32(np.float32(sum_w * sum_l2) - np.float32(sum_l * sum_l))
        if D > F0:
            this_scale = np.float32(np.float32(np.float32(sum_w * sum_xl) - np.float32(sum_x * sum_l)) / D)
            this_min = np.float32(np.float32(np.float32(sum_l2 * sum_x) - np.float32(sum_l * sum_xl)) / D)
            if this_min > F0:
                this_min = F0
                this_scale = np.float32(sum_xl / sum_l2)
            mad = F0
            for i in range(n):
                diff = np.float32(np.float32(np.float32(this_scale * np.float32(Laux[i])) + this_min) - x[i])
                diff = abs(diff) if use_mad else np.float32(diff * diff)
                mad = np.float32(mad + np.float32(weights[i] * diff))
            if mad < best_mad:
                for i in range(n):
                    L[i] = Laux[i]
                best_mad = mad
                scale = this_scale
                vmin = this_min
    return scale, -vmin


@njit(cache=True, error_model="numpy")
def make_qp_quants(n, nmax, x, L, quant_weights):
    """Levels in [0, nmax] for non-negative ``x`` (the sub-block scales and mins of the K-quants
    with importance weights): best of 9 scales, then weighted coordinate descent (make_qp_quants).

    ``L`` must be uint8: ggml stores intermediate levels there and reads them back wrapped.
    """
    vmax = F0
    for i in range(n):
        vmax = vmax if vmax > x[i] else x[i]
    if vmax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F0
    fnmax = np.float32(nmax)
    iscale = np.float32(fnmax / vmax)
    for i in range(n):
        L[i] = nearest_int(np.float32(iscale * x[i])) & 0xFF
    scale = np.float32(F1 / iscale)
    best_mse = F0
    for i in range(n):
        diff = np.float32(x[i] - np.float32(scale * np.float32(L[i])))
        w = quant_weights[i]
        best_mse = np.float32(best_mse + np.float32(np.float32(w * diff) * diff))
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = np.float32(np.float32(np.float32(_TENTH * np.float32(step)) + fnmax) / vmax)
        scale_is = np.float32(F1 / iscale_is)
        mse = F0
        for i in range(n):
            l = nearest_int(np.float32(iscale_is * x[i]))
            l = min(nmax, l)
            diff = np.float32(x[i] - np.float32(scale_is * np.float32(l)))
            w = quant_weights[i]
            mse = np.float32(mse + np.float32(np.float32(w * diff) * diff))
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = F0
    suml2 = F0
    for i in range(n):
        l = nearest_int(np.float32(iscale * x[i]))
        l = min(nmax, l)
        L[i] = l & 0xFF
        w = quant_weights[i]
        fl = np.float32(l)
        sumlx = np.float32(sumlx + np.float32(np.float32(w * x[i]) * fl))
        suml2 = np.float32(suml2 + np.float32(np.float32(w * fl) * fl))
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = quant_weights[i]
            fli = np.float32(L[i])
            slx = np.float32(sumlx - np.float32(np.float32(w * x[i]) * fli))
            sl2 = np.float32(suml2 - np.float32(np.float32(w * fli) * fli))
            if slx > F0 and sl2 > F0:
                new_l = nearest_int(np.float32(np.float32(x[i] * sl2) / slx))
                new_l = min(nmax, new_l)
                if new_l != np.int64(L[i]):
                    fnl = np.float32(new_l)
                    slx = np.float32(slx + np.float32(np.float32(w * x[i]) * fnl))
                    sl2 = np.float32(sl2 + np.float32(np.float32(w * fnl) * fnl))
                    if np.float32(np.float32(slx * slx) * suml2) > np.float32(np.float32(sumlx * sumlx) * sl2):
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return np.float32(sumlx / suml2) if suml2 > F0 else F0


def level_midsums(values):
    """For a sorted 16-entry int table: midsums[j] = values[j-1] + values[j] as float32 (exact)."""
    values = np.asarray(values, dtype=np.int64)
    midsums = np.zeros(16, np.float32)
    midsums[1:] = values[:-1] + values[1:]
    return midsums


@njit(cache=True, error_model="numpy")
def best_index_int8(midsums, x):
    """Index of the entry of a sorted 16-entry table nearest to ``x``; a tie goes up.

    ``midsums`` comes from `level_midsums`. This compares 2*x with the sum of neighbouring entries
    (both exact) in a 4-step binary search, as newer ggml does; for every non-NaN float32 that
    gives the same index as the older best_index_int8 (clamp, bisect, compare x - lo < hi - x)
    that produced our golden bytes, which is checked exhaustively over [-256, 256]. NaN: the older
    function falls through to the last index, and so does this one.
    """
    if x != x:
        return 15
    x2 = np.float32(x + x)
    idx = 8 if x2 >= midsums[8] else 0
    idx = idx + 4 if x2 >= midsums[idx + 4] else idx
    idx = idx + 2 if x2 >= midsums[idx + 2] else idx
    return idx + 1 if x2 >= midsums[idx + 1] else idx

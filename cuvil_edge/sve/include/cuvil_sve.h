/// cuvil_sve.h: public C API of libcuvil_sve, the CPU pre/post-processing kernels of cuvil-edge.
///
/// Every entry point dispatches through one table filled when the library loads
/// (getauxval(AT_HWCAP/AT_HWCAP2) on aarch64; CUVIL_FORCE_ISA=scalar|neon|sve|sve2 overrides).
/// Sizes are size_t, strides are in bytes, buffers are void* where the element type varies.
/// Functions return 0 on success or a negative CUVIL_E* code; they never abort.
/// The scalar path is the reference: every other ISA gives bit-identical float32 and integer
/// results (float16 too: all paths round to nearest even with the same float32 value).
#ifndef CUVIL_SVE_H
#define CUVIL_SVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUVIL_API __attribute__((visibility("default")))

#define CUVIL_ABI_VERSION 1

enum cuvil_isa { CUVIL_ISA_SCALAR = 0, CUVIL_ISA_NEON = 1, CUVIL_ISA_SVE = 2, CUVIL_ISA_SVE2 = 3 };
enum cuvil_dtype { CUVIL_F32 = 0, CUVIL_F16 = 1 };
enum cuvil_op {
    CUVIL_OP_NORMALIZE = 0,
    CUVIL_OP_RESIZE_NORMALIZE = 1,
    CUVIL_OP_QUANTIZE = 2,
    CUVIL_OP_DEQUANTIZE = 3,
    CUVIL_OP_SOFTMAX = 4,
    CUVIL_OP_NMS = 5,
    CUVIL_OP_COUNT = 6
};

#define CUVIL_OK 0
#define CUVIL_EINVAL (-1)   ///< bad argument
#define CUVIL_ENOMEM (-2)   ///< scratch allocation failed
#define CUVIL_EISA (-3)     ///< CUVIL_FORCE_ISA names an unknown ISA or one this CPU lacks

/// @return CUVIL_ABI_VERSION of the loaded library.
CUVIL_API int cuvil_abi_version(void);

/// @return CUVIL_OK, or CUVIL_EISA when CUVIL_FORCE_ISA was rejected at load time; then every
///         kernel refuses to run and cuvil_init_message() says why.
CUVIL_API int cuvil_init_status(void);
/// @return a NUL-terminated message describing the load-time ISA decision or error.
CUVIL_API const char *cuvil_init_message(void);
/// @return the ISA (enum cuvil_isa) chosen for op (enum cuvil_op), or -1 for a bad op.
CUVIL_API int cuvil_isa_for(int op);
/// @return a bit mask (1 << enum cuvil_isa) of the ISAs this CPU offers (and the build has).
CUVIL_API unsigned cuvil_isa_available(void);
/// @return the SVE vector length in bytes read from the hardware (cntb), 0 without SVE.
CUVIL_API size_t cuvil_sve_vector_bytes(void);
/// Re-selects every op's ISA: isa = -1 selects the best available, else that ISA.
/// @return CUVIL_OK or CUVIL_EISA when the CPU lacks that ISA (the table is unchanged).
CUVIL_API int cuvil_select_isa(int isa);

#define CUVIL_MAX_THREADS 64
/// Sets how many threads one call may use (1..CUVIL_MAX_THREADS; default 1 or
/// $CUVIL_NUM_THREADS). Large calls split rows/elements into ranges; results never depend on it.
CUVIL_API int cuvil_set_threads(int n);
/// @return the thread count set by cuvil_set_threads.
CUVIL_API int cuvil_get_threads(void);

/// normalize: uint8 HWC (3 channels) -> float32/float16 CHW, out = (x - mean[c]) * inv_std[c].
/// @param[in]  src         first pixel of the image, 3 bytes per pixel.
/// @param[in]  height,width image size in pixels.
/// @param[in]  src_stride  bytes between rows (>= 3*width).
/// @param[in]  swap        non-zero: output channel c reads source channel 2-c (RGB<->BGR).
/// @param[in]  mean,inv_std 3 values each, in output channel order.
/// @param[out] dst         3*height*width elements of dtype, CHW contiguous.
/// @param[in]  dtype       CUVIL_F32 or CUVIL_F16.
CUVIL_API int cuvil_normalize(const uint8_t *src, size_t height, size_t width, size_t src_stride, int swap,
                              const float *mean, const float *inv_std, void *dst, int dtype);

/// resize_normalize: bilinear resize (half-pixel centres, edge clamp, as cv2.INTER_LINEAR)
/// of a uint8 HWC image into the rectangle (rx, ry, rw, rh) of a dst_h x dst_w CHW tensor,
/// fused with normalize; the rest of the tensor (letterbox) is filled with pad[c]
/// (already normalized, output channel order). One read of the frame, one write of the tensor.
/// @param[in]  pad  3 values, or NULL when the rectangle covers the tensor.
CUVIL_API int cuvil_resize_normalize(const uint8_t *src, size_t height, size_t width, size_t src_stride,
                                     int swap, const float *mean, const float *inv_std, void *dst,
                                     int dtype, size_t dst_h, size_t dst_w, size_t rx, size_t ry, size_t rw,
                                     size_t rh, const float *pad);

/// quantize: float32 -> int8 symmetric, q = saturate(round_half_even(x / scale[c])) (ONNX
/// QuantizeLinear with zero point 0, as ONNX Runtime computes it). NaN gives 0.
/// The tensor is seen as (outer, channels, inner); channels == 1 is per-tensor.
CUVIL_API int cuvil_quantize(const float *src, int8_t *dst, size_t outer, size_t channels, size_t inner,
                             const float *scales);
/// dequantize: int8 -> float32, y = q * scale[c]; same (outer, channels, inner) view.
CUVIL_API int cuvil_dequantize(const int8_t *src, float *dst, size_t outer, size_t channels, size_t inner,
                               const float *scales);

/// softmax_topk: per row of n float32 logits, probs = softmax (max-subtracted, exp, divide by
/// the sum in a fixed 64-lane order so every ISA and vector length agrees), then the k largest
/// probabilities in descending order (ties: lower index first).
/// @param[out] probs  rows*n values, or NULL (then only top-k is written).
/// @param[out] top_scores,top_idx rows*k values each (k may be 0).
CUVIL_API int cuvil_softmax_topk(const float *src, size_t rows, size_t n, size_t src_stride, float *probs,
                                 size_t k, float *top_scores, int32_t *top_idx);

/// nms: decode + non-maximum suppression of n detections.
/// boxes[i] = 4 floats at boxes + i*box_stride + j*box_elem_stride (j = 0..3), in box_format
/// 0 (cx, cy, w, h) or 1 (x1, y1, x2, y2); scores[i][c] at scores + i*score_stride +
/// c*class_stride. Each box takes its best class (lowest index on ties), is kept when the
/// score > score_thr, then greedy NMS in descending score order (ties: lower index first)
/// drops boxes whose IoU with a kept box is > iou_thr (same class unless agnostic).
/// @param[out] out_boxes  max_det*4 floats (x1, y1, x2, y2); out_scores, out_classes,
///             out_index  max_det values each.
/// @return the number of detections kept (>= 0), or a negative CUVIL_E* code.
CUVIL_API long cuvil_nms(const float *boxes, size_t n, ptrdiff_t box_stride, ptrdiff_t box_elem_stride,
                         int box_format, const float *scores, size_t classes, ptrdiff_t score_stride,
                         ptrdiff_t class_stride, float score_thr, float iou_thr, int agnostic,
                         size_t max_det, float *out_boxes, float *out_scores, int32_t *out_classes,
                         int32_t *out_index);

#ifdef __cplusplus
}
#endif
#endif

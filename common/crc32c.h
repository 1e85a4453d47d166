/* crc32c.h: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum every data
 * message carries in its header (proto/ps.proto, field crc32c).
 *
 * x86-64 CPUs with SSE4.2 compute it with the crc32 instruction, three streams interleaved
 * and combined with precomputed shift tables (about one 8-byte word per cycle), and from 1 KiB
 * with 512-bit VPCLMULQDQ folding (256 bytes per step) where the CPU has it; elsewhere a
 * slicing-by-8 table version runs. All give the same value; the choice is made once, at the
 * first call. */
#ifndef PS_CRC32C_H
#define PS_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/**
 * @brief CRC-32C of @p len bytes at @p buf, continuing from @p crc (0 to start).
 * @return the CRC; ps_crc32c(ps_crc32c(0, a, n), b, m) equals the CRC of a then b.
 * @note Thread-safe; no allocation. "123456789" gives 0xE3069283.
 */
uint32_t ps_crc32c(uint32_t crc, const void *buf, size_t len);

/**
 * @brief Copy @p len bytes from @p src to @p dst (not overlapping) and return the CRC of them
 *  continuing @p crc, as ps_crc32c(crc, src, len) would: one pass over the data where the CPU
 *  folds the CRC in vector registers (VPCLMULQDQ), else a copy and then the CRC of @p dst.
 * @note Thread-safe; no allocation.
 */
uint32_t ps_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len);

/**
 * @brief ps_crc32c_copy whose stores bypass the cache, for a destination that another process
 *  reads next on another CPU: it then reads memory instead of taking the lines from this CPU's
 *  cache, and this CPU's stores do not first take back the lines that reader left in its own
 *  cache (on the development VM, whose two vCPUs at times do not share a cache, a 1 MiB copy
 *  into memory the other CPU had read took ~140 us with plain stores, ~22 us streamed).
 *  Streaming stores from the first 64-byte boundary of @p dst on; on a CPU without the folding
 *  copy, the CRC of @p src and then ps_memcpy_nt. The streamed bytes are ordered (sfence)
 *  before any store that follows the call.
 * @note Thread-safe; no allocation.
 */
uint32_t ps_crc32c_copy_nt(uint32_t crc, void *dst, const void *src, size_t len);

/**
 * @brief ps_crc32c() of @p len bytes of floats (a multiple of 4, from a float's first byte) that
 *  also sets *@p odd to 1 when one of them is a NaN or an infinity (it never clears it; NULL:
 *  no check). Where the CPU folds the CRC in vector registers the check tests the vectors
 *  loaded for it (a store apply checks the parameters it wrote at no extra read: psd_store).
 * @note Thread-safe; no allocation.
 */
uint32_t ps_crc32c_floats(uint32_t crc, const void *buf, size_t len, int *odd);

/** @brief ps_crc32c_copy_nt() with ps_crc32c_floats()'s check of the floats copied (@p src
 *  from a float's first byte); a @p dst not 4-byte aligned is written with plain stores. */
uint32_t ps_crc32c_copy_nt_floats(uint32_t crc, void *dst, const void *src, size_t len, int *odd);

struct XXH3_state_s;

/**
 * @brief ps_crc32c_floats(@p crc, @p buf, @p len, @p odd) and XXH3_64bits_update(@p st, @p buf,
 *  @p len) in one pass over the bytes: the CRC, *@p odd and the hash stream are those of the
 *  two calls, which it makes on a CPU without 512-bit VPCLMULQDQ, under ~1.5 KiB, or for a
 *  @p len or stream position not a multiple of 4. The CRC's carry-less multiplies and XXH3's
 *  integer multiplies run side by side (a store apply's params: psd_store_chunk_update).
 *  @p st: a default-secret or custom-secret stream (XXH3_64bits_reset or _withSecret), which
 *  the library's next update and digest go on with.
 * @note Thread-safe for distinct @p st; no allocation.
 */
uint32_t ps_crc32c_xxh3(uint32_t crc, struct XXH3_state_s *st, const void *buf, size_t len,
                        int *odd);

/**
 * @brief memcpy (not overlapping) whose stores bypass the cache: SSE2 streaming stores from the
 *  first 16-byte boundary of @p dst on (x86-64; plain memcpy elsewhere and under 256 bytes),
 *  then sfence, so the bytes are ordered before any store that follows the call.
 * @note Thread-safe; no allocation.
 */
void ps_memcpy_nt(void *dst, const void *src, size_t len);

/** @brief The portable (slicing-by-8) implementation, for tests and benchmarks. */
uint32_t ps_crc32c_sw(uint32_t crc, const void *buf, size_t len);

/** @brief "sse4.2+vpclmulqdq" (512-bit carry-less multiply folding from 1 KiB, crc32 below),
 *  "sse4.2" (the crc32 instruction) or "slicing-by-8": what ps_crc32c() uses. */
const char *ps_crc32c_impl(void);

/**
 * @brief Make ps_crc32c() and the copies use @p impl, one of the names ps_crc32c_impl() gives,
 *  or a slower one than this CPU's best, so that tests and benchmarks reach every path (the
 *  CRC-then-streamed-copy path of ps_crc32c_copy_nt, for one, runs only where the folding copy
 *  does not). @p impl NULL restores the best.
 * @return 0, or -EINVAL (PS_EINVAL) for a name this CPU or build does not have; nothing
 *  changes then.
 * @note Not thread-safe: call it while no other thread computes a CRC.
 */
int ps_crc32c_use(const char *impl);

#endif

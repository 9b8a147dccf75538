/* squeeze's binding to ISA-L's igzip (Debian libisal): raw DEFLATE of one
 * buffer with a reusable context. A C shim rather than Rust declarations of
 * struct isal_zstream, whose layout (a large internal state) belongs to the
 * library's header: compiled against that header, it cannot drift from it.
 * Output is raw DEFLATE (RFC 1951, no wrapper): any inflater (libdeflate,
 * zlib) decodes it. */
#include <isa-l/igzip_lib.h>
#include <stdint.h>
#include <stdlib.h>

struct sqz_isal {
	struct isal_zstream s;
	uint8_t *level_buf;
	uint32_t level_buf_size;
	uint32_t level;
};

/* A context for ISA-L level 0..3, or NULL (bad level, out of memory). */
struct sqz_isal *sqz_isal_new(uint32_t level)
{
	static const uint32_t sizes[4] = {
		ISAL_DEF_LVL0_DEFAULT, ISAL_DEF_LVL1_DEFAULT,
		ISAL_DEF_LVL2_DEFAULT, ISAL_DEF_LVL3_DEFAULT,
	};
	struct sqz_isal *c;
	if (level > ISAL_DEF_MAX_LEVEL)
		return NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->level = level;
	c->level_buf_size = sizes[level];
	if (c->level_buf_size) {
		c->level_buf = malloc(c->level_buf_size);
		if (!c->level_buf) {
			free(c);
			return NULL;
		}
	}
	return c;
}

void sqz_isal_free(struct sqz_isal *c)
{
	if (!c)
		return;
	free(c->level_buf);
	free(c);
}

/* Compresses src[0..len) into dst[0..cap): the output length; 0 when it
 * does not fit in cap bytes; a negative ISA-L error code otherwise. */
long sqz_isal_deflate(struct sqz_isal *c, const uint8_t *src, uint32_t len,
		      uint8_t *dst, uint32_t cap)
{
	int r;
	isal_deflate_stateless_init(&c->s);
	c->s.next_in = (uint8_t *)src;
	c->s.avail_in = len;
	c->s.next_out = dst;
	c->s.avail_out = cap;
	c->s.level = c->level;
	c->s.level_buf = c->level_buf;
	c->s.level_buf_size = c->level_buf_size;
	c->s.end_of_stream = 1;
	c->s.flush = NO_FLUSH;
	c->s.gzip_flag = IGZIP_DEFLATE;
	r = isal_deflate_stateless(&c->s);
	if (r == STATELESS_OVERFLOW)
		return 0;
	if (r != COMP_OK)
		return r < 0 ? r : -1000 - r;
	return (long)c->s.total_out;
}
